"""The LLM stage as the event loop sees it: ``await``-able reply streams for many sessions.

``BatchedLlm`` owns a ``BatchedChat`` (llm/batched.py) on one thread that runs its
steps; sessions call ``stream(session_id, messages, max_tokens, cancel)`` from the
event loop and iterate text deltas (``str``) and, with ``tools``, pieces of function calls
(``llm.replies.ToolCallDelta``). One step's output for all sessions goes back to
the loop in one hand-off (``call_soon_threadsafe`` per step, not per token), so no
thread is tied to a session and every session's turn joins the running batch.

Each reply's tag says where its events go (``(route, target)``): a ``_LoopRoute`` per event
loop here; in the engine process of ``server.front_ends`` the front end's link
(``pipeline.engine_link``), so every front end's conversations share one batch.

``SerialLlm`` gives the same interface over a one-conversation-at-a-time engine with
``stream(messages, cancel, max_tokens) -> Iterator[str]`` (test fakes) on a ``ModelWorker``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from typing import Any

from pipeline.workers import BACKGROUND, NORMAL, ModelWorker

log = logging.getLogger(__name__)

#: Longest wait of the engine thread for new work before it checks for shutdown, s.
IDLE_WAIT_S = 0.2


class BatchedLlm:
    """Runs a ``BatchedChat`` on its own thread; streams replies to asyncio callers."""

    def __init__(self, engine: Any, spare_cores: Callable[[], bool] | None = None) -> None:
        """``spare_cores``: True when no other stage uses the CPU now (``BatchedChat.step``)."""
        self.engine = engine
        self._spare_cores = spare_cores
        from llm.end_of_turn import TextEndOfTurn

        # None: the GGUF's template gives no prompt to score words with (said once in the log)
        self._words = TextEndOfTurn.for_chat(engine)
        self._closed = threading.Event()
        self._routes: dict[asyncio.AbstractEventLoop, _LoopRoute] = {}
        self._thread = threading.Thread(target=self._run, name="llm-0", daemon=True)
        self._thread.start()

    async def stream(self, session: Hashable, messages: list[dict], max_tokens: int,
                     cancel: threading.Event, priority: int = NORMAL,
                     on_done: Callable[[Any], None] | None = None, tools: tuple[dict, ...] = (),
                     tool_choice: str | dict | None = None, words: asyncio.Future | None = None) -> AsyncIterator[Any]:
        """Text deltas (``str``) and function-call pieces (``ToolCallDelta``) of the reply to ``messages``
        in ``session``'s conversation.

        Ends when the reply does, or soon after ``cancel`` is set; closing the iterator
        (a cancelled task) cancels the reply. Engine errors are raised here. ``on_done``
        gets the reply's ``GenerationStats`` when it ends. ``tools`` / ``tool_choice``: the
        functions the model may call, Chat Completions shape (``llm.replies.ReplyOptions``).
        ``words``: set to the end-of-turn score of the last message's words (the user's, as
        ``end_of_turn`` gives it), asked with the reply so it is read from the reply's own prompt.
        """
        from llm.batched import ReplyOptions

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        options = ReplyOptions(max_tokens=max_tokens, priority=priority, cancel=cancel, tools=tuple(tools),
                               tool_choice=tool_choice)
        route = self._routes.get(loop)
        if route is None:
            route = self._routes[loop] = _LoopRoute(loop)
        probes = []
        try:
            if words is not None:
                probe = self.words_probe(session, messages[-1]["content"], messages[:-1],
                                         lambda p: loop.call_soon_threadsafe(_resolve, words, p), tools)
                probes = [probe] if probe is not None else []
            reply = self.engine.submit(session, messages, options, tag=(route, events), probes=probes)
        except BaseException:
            if words is not None:
                _resolve(words, None)
            raise
        try:
            while True:
                event = await events.get()
                if event.text:
                    yield event.text
                for call in event.tool_calls:
                    yield call
                if event.stats is not None:
                    if on_done is not None:
                        on_done(event.stats)
                    if reply.error is not None:
                        raise reply.error
                    return
        finally:
            if not reply.done:
                self.engine.cancel(reply)

    def prefill(self, session: Hashable, messages: list[dict]) -> None:
        """Read ``messages`` into ``session``'s sequence ahead of its next turn (``BatchedChat.prefill``),
        after the turns of other sessions waiting for their first token."""
        from llm.batched import ReplyOptions

        self.engine.prefill(session, messages, ReplyOptions(priority=BACKGROUND), tag=(_DISCARD, None))

    def release(self, session: Hashable) -> None:
        """The session ended: free its KV sequence."""
        self.engine.release(session)

    @property
    def scores_words(self) -> bool:
        """True when ``end_of_turn`` can score (the GGUF's chat template gives a prompt)."""
        return self._words is not None

    async def end_of_turn(self, session: Hashable, transcript: str, conversation: list[dict],
                          tools: tuple[dict, ...] = ()) -> float | None:
        """Probability that ``transcript`` is a finished turn after ``conversation`` (system prompt
        and history; ``tools`` as the reply's prompt has them) in ``session``, from its words
        (llm/end_of_turn.py), read in the replies' batch (from the speculative reply's own prompt
        when it holds the words); None when the model gives no score."""
        if self._words is None:
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(probability: float | None) -> None:  # the engine thread
            loop.call_soon_threadsafe(_resolve, future, probability)

        self.probe_words(session, transcript, conversation, done, tools)
        return await future

    def probe_words(self, session: Hashable, transcript: str, conversation: list[dict],
                    done: Callable[[float | None], None], tools: Sequence[dict] = ()) -> None:
        """``end_of_turn`` for any thread: ``done(probability)`` is called on the engine thread."""
        probe = self.words_probe(session, transcript, conversation, done, tools)
        if probe is not None:
            self.engine.probe(probe)

    def words_probe(self, session: Hashable, transcript: str, conversation: list[dict],
                    done: Callable[[float | None], None], tools: Sequence[dict] = ()) -> Any:
        """The ``llm.batched.Probe`` of ``end_of_turn``; None (``done(None)`` called) when the model
        gives no score (a prompt it cannot make is logged: the reply it goes with still runs)."""
        if self._words is None or not isinstance(transcript, str):
            done(None)
            return None
        try:
            return self._words.probe(transcript, conversation, done, session, tools)
        except Exception:  # noqa: BLE001 - no score: the turn ends on the sound alone
            log.exception("no end-of-turn prompt for the words of %r", transcript[:80])
            done(None)
            return None

    def pending(self) -> int:
        """Replies generating or waiting for a sequence."""
        r = self.engine.report()
        return r["replies_running"] + r["replies_waiting"]

    def report(self) -> dict[str, int]:
        """The engine's memory and batch figures (``BatchedChat.report``)."""
        return self.engine.report()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self.engine.wait(IDLE_WAIT_S)
                # asked once the step's work is known, not before the wait for it
                events = self.engine.step(spare_cores=self._spare_cores is not None and self._spare_cores())
            except Exception as exc:  # a bug: end the running replies rather than hang them
                log.exception("LLM step failed")
                events = self.engine.abort(exc)
            by_route: dict[Any, list] = defaultdict(list)
            for event in events:
                by_route[event.reply.tag[0]].append(event)
            for route, batch in by_route.items():
                route.deliver(batch)

    def stop(self) -> None:
        """Stop the engine thread (waits for the step in progress)."""
        self._closed.set()
        self._thread.join()

    def close(self) -> None:
        self.stop()
        self.engine.close()


class _LoopRoute:
    """Where a step's events for replies awaited on one event loop go: one hand-off per step.

    A reply's tag is ``(route, target)``; ``route.deliver(events)`` runs on the LLM thread. Here
    the target is the awaiting stream's queue; the engine process routes to a front end's link.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def deliver(self, events: list) -> None:
        try:
            self.loop.call_soon_threadsafe(_deliver, events)
        except RuntimeError:  # the loop is closed (shutdown)
            pass


class _Discard:
    """The route of a prefill: nobody awaits its events."""

    def deliver(self, events: list) -> None:
        pass


_DISCARD = _Discard()


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _deliver(events: list) -> None:
    for event in events:
        event.reply.tag[1].put_nowait(event)


class SerialLlm:
    """``BatchedLlm``'s interface over an engine answering one conversation at a time."""

    def __init__(self, engine: Any, queue_size: int = 64) -> None:
        self.worker = ModelWorker("llm", [engine], queue_size=queue_size)
        self.engine = engine

    def stream(self, session: Hashable, messages: list[dict], max_tokens: int,
               cancel: threading.Event, priority: int = NORMAL,
               on_done: Callable[[Any], None] | None = None, tools: tuple[dict, ...] = (),
               tool_choice: str | dict | None = None) -> AsyncIterator[Any]:
        offered = {"tools": tools, "tool_choice": tool_choice} if tools else {}  # engines without tools: none

        def generate(llm: Any) -> Iterator[Any]:
            yield from llm.stream(messages, cancel=cancel, max_tokens=max_tokens, **offered)
            stats = getattr(llm, "last_stats", None)
            if on_done is not None and stats is not None:
                on_done(stats)

        return self.worker.stream(generate, cancel, priority=priority)

    def prefill(self, session: Hashable, messages: list[dict]) -> None:
        pass  # nothing is cached between turns

    scores_words = False  # no batch to read a probe in: the end of turn is the audio's

    async def end_of_turn(self, session: Hashable, transcript: str, conversation: list[dict],
                          tools: tuple[dict, ...] = ()) -> float | None:
        return None

    def release(self, session: Hashable) -> None:
        pass

    def pending(self) -> int:
        return self.worker.pending()

    def close(self) -> None:
        self.worker.close()
