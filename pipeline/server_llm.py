"""The LLM stage over an OpenAI-compatible server (``llm.backend = "openai"``), as the event loop sees it.

``ServerLlm`` has ``BatchedLlm``'s interface (pipeline/llm_worker.py) over a ``ChatServer``
(llm/chat_completions.py): each reply is one streamed HTTP request carrying the session's whole
history, awaited on the event loop (no thread per reply); the server does its own batching and
caching, so ``prefill`` and ``release`` have nothing to do and ``priority`` is not sent.

``/ready`` asks ``not_ready()``: the server's ``/models`` is checked at start-up and every
``READY_CHECK_S`` after while no reply streams (then the replies tell: one that cannot reach the
server, times out or breaks off marks it unavailable, one that streams marks it back), so a server
that cannot be reached (or refuses the key) takes the replica out of a load balancer's rotation
with the reason in the body. Checks wait while replies stream because a server that answers one
request at a time (llama-cpp-python's) would hold the check behind them, or drop a reply for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from base.errors import ModelUnavailable, VoxloopError
from llm.chat_completions import ChatServer
from llm.replies import ReplyOptions, ToolCallDelta
from pipeline.workers import NORMAL

log = logging.getLogger(__name__)

#: Seconds between checks of the server for ``/ready``: Kubernetes asks every 10 s by default, so
#: its answer is never more than half a period old.
READY_CHECK_S = 5.0


class ServerLlm:
    """Streams replies from an OpenAI-compatible server to asyncio callers."""

    #: No end-of-turn score from the words (``end_of_turn``): ``semantic_vad`` decides by the sound.
    scores_words = False

    def __init__(self, server: ChatServer) -> None:
        self.server = server
        self._replies = 0
        self._problem: str | None = "the LLM server has not been checked yet"
        self._checker: asyncio.Task | None = None

    async def start(self) -> None:
        """Check the server once (``/ready`` is right as soon as loading ends), then every ``READY_CHECK_S``."""
        await self._check(first=True)
        self._checker = asyncio.create_task(self._check_forever(), name="llm-server-check")

    def not_ready(self) -> str | None:
        """Why the server cannot serve replies now (the last check's error), or None."""
        return self._problem

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(READY_CHECK_S)
            if not self._replies:
                await self._check()

    async def _check(self, first: bool = False) -> None:
        try:
            model = await self.server.check()
        except VoxloopError as exc:
            if first or self._problem is None:
                log.error("%s", exc)
            self._problem = exc.message
            return
        if first or self._problem is not None:
            log.info("LLM server at %s answers; replies use model %r", self.server.base_url, model)
        self._problem = None

    async def stream(self, session: Hashable, messages: list[dict], max_tokens: int,
                     cancel: threading.Event, priority: int = NORMAL,
                     on_done: Callable[[Any], None] | None = None, tools: tuple[dict, ...] = (),
                     tool_choice: str | dict | None = None,
                     words: asyncio.Future | None = None) -> AsyncIterator[str | ToolCallDelta]:
        """Text (``str``) and function-call pieces (``ToolCallDelta``) of the reply to ``messages``.

        Ends when the reply does, or at the next piece after ``cancel`` is set; closing the
        iterator (a cancelled task) closes the HTTP stream. Server errors are raised here as
        ``ModelError`` / ``Overloaded``. ``on_done`` gets the reply's ``GenerationStats``.
        ``words`` (the words' end-of-turn score): None, as ``end_of_turn`` gives.
        """
        if words is not None and not words.done():
            words.set_result(None)
        options = ReplyOptions(max_tokens=max_tokens, priority=priority, cancel=cancel, tools=tuple(tools),
                               tool_choice=tool_choice)
        self._replies += 1
        try:
            async for piece in self.server.stream(messages, options, on_done):
                self._problem = None
                yield piece
        except ModelUnavailable as exc:
            self._problem = exc.message
            raise
        finally:
            self._replies -= 1

    async def end_of_turn(self, session: Hashable, transcript: str, conversation: list[dict],
                          tools: tuple[dict, ...] = ()) -> float | None:
        """None: scoring the words would take a request per pause and the next token's probabilities,
        which not every server gives."""
        return None

    def prefill(self, session: Hashable, messages: list[dict]) -> None:
        pass  # the server caches prompts itself, if at all

    def release(self, session: Hashable) -> None:
        pass  # the history lives in the session; the server holds nothing per session

    def pending(self) -> int:
        """Replies streaming now."""
        return self._replies

    def report(self) -> None:
        """No engine figures here (``/metrics`` shows the in-process engine's)."""
        return None

    def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop: the process is ending anyway
            asyncio.get_running_loop().create_task(self.server.close())
