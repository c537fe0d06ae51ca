"""The conversation of one session: history, the current turn and its reply, what the user heard.

``Conversation`` starts and ends turns (``response.done`` in its final state, the trace),
makes replies (LLM -> clauses -> TTS through ``Responder``), stops them (barge-in, cancel;
history keeps only what was heard) and serves the client events about items and responses.
*When* a voice turn starts, ends or is interrupted is decided elsewhere (``pipeline/turn_taking.py``,
performed by ``pipeline/voice_input.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipeline.engines import Engines
from pipeline.history import History, Message
from pipeline.respond import ReplyRequest, Responder, ResponseSettings, close_output, response_done
from pipeline.tool_calls import ToolRequest, chat_messages, tool_request
from pipeline.trace import Metrics, TraceSink, TurnTrace
from pipeline.turn import Turn, TurnControl
from realtime import events as ev
from realtime.items import ContentPart, ErrorInfo, MessageItem
from realtime.tools import FunctionCallOutputItem
from realtime.wire import ErrorCode, new_id
from base.config import Config
from base.errors import InvalidInput, ProtocolError, VoxloopError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AfterSent:
    """An outbox entry that runs ``run()`` once every event queued before it is on the socket."""

    run: Callable[[], None]


class Conversation:
    """History and turns of one session; ``send`` queues a server event, ``settings()`` is the session."""

    def __init__(self, session_id: str, cfg: Config, engines: Engines, send: Callable[[Any], None],
                 metrics: Metrics, traces: TraceSink, settings: Callable[[], Any],
                 room: Callable[[], Awaitable[bool]] | None = None) -> None:
        """``room``: awaited before each audio delta of a committed reply (``Session.audio_room``)."""
        self.id = session_id
        self.cfg = cfg
        self.metrics = metrics
        self.traces = traces
        self._send = send
        self._settings = settings
        self.turns = TurnControl(send)
        self.responder = Responder(cfg, engines, self.turns, session_id, room=room)
        self.history = History(max_chars=int((cfg.llm.n_ctx - cfg.llm.max_tokens) * 3))
        self.last_turn: Turn | None = None
        #: Called when a reply the user may be hearing is stopped (turn taking forgets a paused reply).
        self.on_reply_stopped: Callable[[], None] = lambda: None
        #: Called with a response id whose audio not yet on the socket must not be sent.
        self.on_audio_stopped: Callable[[str], None] = lambda response_id: None

    # ------------------------------------------------------------------ turns
    def new_turn(self, mode: str, committed: bool, utterance: int | None = None) -> Turn:
        return self.turns.begin(new_id("resp"), new_id("item"), TurnTrace(0, self.id, mode), committed, utterance)

    def spawn(self, turn: Turn, coro: Awaitable[None]) -> None:
        task = asyncio.create_task(coro, name=f"{self.id}-turn{turn.turn_id}")
        turn.tasks.add(task)
        task.add_done_callback(self.task_done)

    def task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug, not a user error
            log.error("%s: %s failed", self.id, task.get_name(), exc_info=task.exception())

    def reply_turn(self) -> Turn | None:
        """The committed reply the user may be hearing (running, or finished but still playing)."""
        turn = self.turns.current or self.last_turn
        return turn if turn is not None and turn.committed else None

    def audible(self) -> bool:
        turn = self.reply_turn()
        return turn is not None and turn.still_audible()

    def find_turn(self, item_id: str) -> Turn | None:
        for turn in (self.turns.current, self.last_turn):
            if turn is not None and turn.item_id == item_id:
                return turn
        return None

    @staticmethod
    def user_message(item_id: str, status: str, transcript: str | None = None) -> MessageItem:
        return MessageItem(id=item_id, role="user", status=status, object="realtime.item",  # type: ignore[arg-type]
                           content=(ContentPart(type="input_audio", transcript=transcript),))

    def add_user_message(self, turn: Turn) -> None:
        if turn.user_added or not turn.user_text or turn.user_item_id is None:
            return  # an empty transcript says nothing to the LLM
        turn.user_added = True
        self.history.add("user", turn.user_text, turn.user_item_id, content_type="input_audio")

    # ------------------------------------------------------------------ replies
    async def reply(self, turn: Turn, pending_user: str | None = None,
                    opts: ev.ResponseOptions | None = None, tools: ToolRequest | None = None) -> None:
        """Answer in ``turn``: the conversation so far (plus ``pending_user``, a speculative turn's
        words), or ``opts.input`` in its place; ``opts`` (``response.create``) over the session;
        ``tools``: the functions the model may call (default: the session's)."""
        session = self._settings()
        system = (opts.instructions if opts else None) or session.instructions or self.cfg.llm.system_prompt
        if opts is not None and opts.input is not None:
            messages = [{"role": "system", "content": system}, *self.input_messages(opts.input)]
        else:
            messages = self.history.messages(system, pending_user)
        dropped = self.history.dropped
        settings = self.response_settings(opts)
        turn.options = settings
        max_tokens = self.cfg.llm.max_tokens
        if settings.max_output_tokens != "inf":
            max_tokens = min(max_tokens, int(settings.max_output_tokens))
        output = session.audio.output
        req = ReplyRequest(messages, max_tokens, output.format.rate, audio=settings.output_modalities == ("audio",),
                           tools=tool_request(session) if tools is None else tools,
                           speed=output.speed, voice=output.voice)
        text = await self.responder.run(turn, req)
        # A speculative turn may finish before the user has; history changes wait for the commit.
        await turn.released.wait()
        if pending_user is not None:
            self.add_user_message(turn)
        if settings.conversation != "none" and text:
            turn.history_index = self.history.add("assistant", text, turn.item_id,
                                                  content_type="output_audio" if req.audio else "output_text")
        if settings.conversation != "none":
            self.add_calls(turn)
        if self.history.dropped != dropped:
            # The history was cut: every token the LLM holds after the cut moved, and the next turn's
            # first token would wait for all of them (730 tokens: 5.4 s on one thread of a 2-core VM).
            self.responder.engines.llm.prefill(self.id, self.history.messages(system))
        self.finish(turn, "incomplete" if getattr(turn.generation, "finish_reason", None) == "length"
                    else "completed")

    def response_settings(self, opts: ev.ResponseOptions | None) -> ResponseSettings:
        """What a response is asked to be: ``response.create``'s options over the session's."""
        session = self._settings()
        modalities = (opts.output_modalities if opts else None) or session.output_modalities
        limit = session.max_output_tokens
        if opts is not None and opts.max_output_tokens is not None:
            limit = opts.max_output_tokens
        return ResponseSettings(
            output_modalities=modalities, max_output_tokens=limit, metadata=opts.metadata if opts else None,
            conversation=(opts.conversation if opts else None) or "auto",
            audio_output=session.audio.output if modalities == ("audio",) else None)

    def input_messages(self, items: tuple) -> list[dict]:
        """LLM messages of ``response.create``'s ``input``: messages as given, references to
        conversation items as the history holds them. Raises ``item_not_found`` for an unknown reference."""
        entries = []
        for item in items:
            if item.type == "item_reference":
                message = self.history.find(item.id)
                if message is None:
                    raise InvalidInput(f"input: no item {item.id} in the conversation", code=ErrorCode.ITEM_NOT_FOUND)
                entries.append(message)
            else:
                entries.append(Message(item.role, " ".join(p.content_text for p in item.content).strip(), item.id or ""))
        return chat_messages([m for m in entries if m.content or m.call_id is not None])

    async def guarded_reply(self, turn: Turn, **kwargs: Any) -> None:
        try:
            await self.reply(turn, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.fail(turn, exc)

    def finish(self, turn: Turn, status: str, error: ErrorInfo | None = None) -> None:
        """End ``turn``; a started response ends with ``response.done`` carrying ``status``
        (completed | incomplete | failed) and its final item."""
        if not self.turns.is_current(turn):
            return
        if turn.response_started:
            items = close_output(turn, "completed" if status == "completed" else "incomplete")[1]
            reason = "max_output_tokens" if status == "incomplete" else None
            self.turns.emit(turn, response_done(turn, status, reason, items, error))
        self.turns.finish(turn, status)
        self.last_turn = turn
        turn.trace.mark("done")
        self.record(turn, status)

    def record(self, turn: Turn, status: str) -> None:
        """Write the turn's trace once what it queued is sent (so ``first_audio_sent`` is real)."""

        def record() -> None:
            summary = self.traces.record(turn.trace, status)
            if self.cfg.trace.send_to_client and turn.committed and status != "empty_transcript":
                self._send(ev.XTurnMetrics(response_id=turn.response_id, item_id=turn.item_id, metrics=summary))

        self._send(AfterSent(record))

    def fail(self, turn: Turn, exc: BaseException) -> None:
        """A model failed mid-turn: end what the client saw in final states, carrying the error.

        ASR: ``input_audio_transcription.failed`` and the user item done (no response is made).
        LLM or TTS: the reply's item ends ``incomplete`` and ``response.done`` is ``failed``
        with ``status_details.error``. No separate ``error`` event (as in the GA API).
        A speculative turn just stops; the committed turn after it tries again.
        """
        if not turn.committed:
            self.turns.interrupt("failed", turn)
            return
        if not isinstance(exc, VoxloopError):
            log.exception("%s: internal error", self.id, exc_info=exc)
        error = ev.error_info(exc)
        self.metrics.errors.labels(code=error.code).inc()
        if turn.user_text is None and turn.user_item_id is not None:
            item = turn.user_item_id
            self.turns.emit(turn, ev.InputAudioTranscriptionFailed(item_id=item, error=error))
            self.turns.emit(turn, ev.ConversationItemDone(item=self.user_message(item, "completed"),
                                                          previous_item_id=turn.previous_item_id))
        elif turn.response_started:
            for event in close_output(turn, "incomplete")[0]:
                self.turns.emit(turn, event)
        self.finish(turn, "failed", error)

    def interrupt(self, reason: str, by_voice: bool = True) -> Turn | None:
        """Barge-in / cancel: stop the current turn, tell the client, keep only heard text.

        ``by_voice``: the user spoke over the reply, so a finished reply that is still
        playing is cut in history too (the client stops playback on speech_started).
        """
        turn = self.turns.interrupt(reason)
        if turn is None:
            last = self.last_turn
            if by_voice and last is not None and last.still_audible():
                self.truncate_history(last, last.heard_ms())
                last.played_ms = last.heard_ms()  # no longer audible: the client stops playback
                last.stopped = True
                self.on_audio_stopped(last.response_id)
                self.on_reply_stopped()
            return None
        if not turn.committed:
            self.traces.record(turn.trace, "discarded")
            return turn
        self.on_audio_stopped(turn.response_id)
        self.on_reply_stopped()
        self.last_turn = turn
        turn.played_ms = turn.heard_ms()  # frozen: the client stops playback on speech_started
        turn.stopped = True  # speech after this is no speech over a reply (it was answered late)
        heard = turn.heard_text()
        in_conversation = turn.options is None or turn.options.conversation != "none"
        if heard and in_conversation:
            turn.history_index = self.history.add("assistant", heard, turn.item_id,
                                                  content_type="output_audio" if turn.spoken else "output_text")
        if in_conversation:
            self.add_calls(turn)  # calls whose arguments were complete: the client may be running them
        if turn.response_started:  # its events are dropped from now on: these go out directly
            events, items = close_output(turn, "incomplete")
            for event in events:
                self._send(event)
            self._send(response_done(turn, "cancelled", reason, items))
        turn.trace.mark("done")
        self.record(turn, "cancelled")
        return turn

    def truncate_history(self, turn: Turn, heard_ms: float) -> None:
        if turn.history_index is not None:
            self.history.truncate(turn.history_index, turn.item_id, turn.heard_text(heard_ms))

    def audio_sent(self, event: ev.ResponseOutputAudioDelta) -> None:
        """The hub's writer put ``event`` on the socket: the first one starts the playback clock."""
        turn = self.turns.current
        if turn is not None and turn.response_id == event.response_id and turn.first_audio_at is None:
            turn.first_audio_at = time.monotonic()
            turn.trace.mark("first_audio_sent", turn.first_audio_at)

    def add_calls(self, turn: Turn) -> None:
        """Put the reply's complete function calls in the history (once)."""
        if turn.calls is None:
            return
        for call in turn.calls.done:
            if not self.history.has("function_call", call.call_id):
                self.history.add("function_call", call.arguments, call.item_id, call_id=call.call_id, name=call.name)

    def _check_output(self, item: FunctionCallOutputItem) -> None:
        """Refuse an output for no call of this conversation, or for a call already answered."""
        call_id = item.call_id
        if self.history.has("function_call_output", call_id):
            raise ProtocolError(ErrorCode.CALL_ALREADY_ANSWERED, f"item.call_id: call {call_id} already has an output",
                                param="item.call_id")
        if self.history.has("function_call", call_id):
            return
        for turn in (self.turns.current, self.last_turn):
            call = turn.calls.find(call_id) if turn is not None and turn.calls is not None else None
            if call is not None and call.done:
                return  # its response is still ending: the call enters the history with it
            if call is not None:
                raise ProtocolError(ErrorCode.UNKNOWN_CALL_ID, f"item.call_id: call {call_id} was cut off before its "
                                    "arguments were complete (the response was cancelled); it is not in the "
                                    "conversation", param="item.call_id")
        raise ProtocolError(ErrorCode.UNKNOWN_CALL_ID, f"item.call_id: no function call {call_id} in this "
                            "conversation", param="item.call_id")

    # ------------------------------------------------------------------ client events
    def call_item_create(self, event: ev.ConversationItemCreate, item_id: str, after: str | None) -> None:
        """A function call's output (or a call the client adds itself) enters the history as ``item_id``,
        after item ``after`` (``pipeline.items.ConversationItems.create`` checked and announces it)."""
        item = event.item
        if isinstance(item, FunctionCallOutputItem):
            self._check_output(item)
            self.history.add("function_call_output", item.output, item_id, call_id=item.call_id, after=after)
        else:
            if self.history.has("function_call", item.call_id):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"item.call_id: a call {item.call_id} is already in "
                                    "the conversation", param="item.call_id")
            self.history.add("function_call", item.arguments, item_id, call_id=item.call_id, name=item.name,
                             after=after)

    def response_create(self, event: ev.ResponseCreate) -> None:
        current = self.turns.running
        if current is not None and current.committed and current.calls is not None and current.calls.done:
            # The response that called a function is ending (its response.done is on the way): a client
            # that answers the call at once asks for the next response before it. Start that one after.
            task = asyncio.create_task(self._create_after(current, event))
            task.add_done_callback(self.task_done)
            return
        if current is not None and current.transcribe_only:
            # create_response false: the user's turn is still being transcribed; answer once its
            # transcript is in the history (or it was dropped: speech went on).
            task = asyncio.create_task(self._create_after(current, event))
            task.add_done_callback(self.task_done)
            return
        if current is not None and current.committed:
            if current.trace.mode == "push_to_talk" and "llm_start" not in current.trace.t:
                # GA clients send response.create after commit; voxloop already answers
                # the commit, so this request joins that response (documented).
                return
            raise InvalidInput("a response is already in progress; cancel it first",
                               code=ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
        opts = event.response
        tools = tool_request(self._settings(), opts)  # a bad tool_choice is refused before anything stops
        if opts is not None and opts.input is not None:
            self.input_messages(opts.input)  # item_not_found before anything changes
        self.interrupt("turn_detected", by_voice=False)  # drops a speculative turn, if any
        turn = self.new_turn("text", committed=True)
        turn.trace.mark("vad_end")
        self.spawn(turn, self.guarded_reply(turn, opts=opts, tools=tools))

    def silence_reply(self, item_id: str, silence_ms: float, mode: str) -> None:
        """The user said nothing for ``silence_ms`` after the last response (``idle_timeout_ms``):
        the silent stretch is committed as the user item ``item_id`` (empty transcript) and answered.
        The LLM reads that item as a note saying so: it heard no words to pass on."""
        previous = self.history.last_item_id()
        self._send(ev.InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous))
        turn = self.new_turn(mode, committed=True)
        turn.trace.mark("vad_end")
        turn.user_item_id, turn.previous_item_id = item_id, previous
        turn.user_text = f"(The user has said nothing for {silence_ms / 1000:.0f} seconds.)"
        item = self.user_message(item_id, "completed", "")
        self.turns.emit(turn, ev.ConversationItemAdded(item=item, previous_item_id=previous))
        self.turns.emit(turn, ev.ConversationItemDone(item=item, previous_item_id=previous))
        self.add_user_message(turn)
        self.spawn(turn, self.guarded_reply(turn))

    async def _create_after(self, turn: Turn, event: ev.ResponseCreate) -> None:
        await turn.finished.wait()
        self.response_create(event)

    def response_cancel(self, event: ev.ResponseCancel) -> None:
        current = self.turns.current
        if current is None or not current.committed or (
                event.response_id is not None and event.response_id != current.response_id):
            raise InvalidInput("no active response to cancel", code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE)
        self.interrupt("client_cancelled")

    def truncate(self, event: ev.ConversationItemTruncate) -> None:
        turn = self.find_turn(event.item_id)
        if turn is None and not self.history.has_item(event.item_id):
            raise InvalidInput(f"no assistant item {event.item_id}", code=ErrorCode.ITEM_NOT_FOUND)
        if turn is not None:
            turn.played_ms = float(event.audio_end_ms)
            self.truncate_history(turn, event.audio_end_ms)
        self._send(ev.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                                audio_end_ms=event.audio_end_ms))

    def playback(self, event: ev.XPlayback) -> None:
        turn = self.find_turn(event.item_id)
        if turn is None:
            if not self.history.has_item(event.item_id):
                raise InvalidInput(f"no assistant item {event.item_id}", code=ErrorCode.ITEM_NOT_FOUND)
            return  # a late report about an old reply: nothing left to update
        if turn.played_ms is None and event.audio_end_ms > 0:
            turn.trace.mark("playback_start", time.monotonic() - event.audio_end_ms / 1000)
        turn.played_ms = max(turn.played_ms or 0.0, float(event.audio_end_ms))

    def clear_audio(self, event: ev.OutputAudioBufferClear) -> None:
        """``output_audio_buffer.clear``: the current reply's audio stops (a reply still being made is
        cancelled, ``client_cancelled``); the history keeps what the user heard of it."""
        turn = self.reply_turn()
        if turn is None:
            return
        if self.turns.is_current(turn) or turn.still_audible():
            self.interrupt("client_cancelled")
        self._send(ev.OutputAudioBufferCleared(response_id=turn.response_id))
