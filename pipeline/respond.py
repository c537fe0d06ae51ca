"""One assistant reply: LLM tokens -> clause segmenter -> TTS -> Realtime events.

The LLM streams on its worker thread while the TTS worker speaks the clauses already
cut, so the first audio leaves after the first clause, not after the whole reply.
Every event goes through ``TurnControl.emit`` so a stale or cancelled turn sends
nothing and a speculative one holds its events until committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engines import Engines
from pipeline.tool_calls import ReplyCalls, ToolRequest
from pipeline.turn import SpokenClause, Turn, TurnControl
from pipeline.workers import NORMAL, URGENT
from realtime import events as ev
from realtime.items import (
    ContentPart,
    ErrorInfo,
    MessageItem,
    ResponseAudio,
    ResponseObject,
    ResponseStatusDetails,
    ResponseUsage,
)
from tts_engine.engine import SynthesisOptions
from tts_engine.segmenter import ClauseSegmenter
from base.config import Config

@dataclass(frozen=True)
class ReplyRequest:
    """What to answer and how."""

    messages: list[dict]
    max_tokens: int
    output_rate: int  # Hz of audio sent to the client
    audio: bool = True  # False: text-only reply (no TTS)
    priority: int = NORMAL
    tools: ToolRequest = ToolRequest()  # functions the model may call (none by default)
    speed: float = 1.0  # the session's audio.output.speed (divides the TTS length scale)
    voice: str | None = None  # a name of tts.voices; None: the default voice


@dataclass(frozen=True)
class ResponseSettings:
    """What one response was asked to be (``response.create`` over the session), as
    ``response.created`` and ``response.done`` report it."""

    output_modalities: tuple[str, ...] = ("audio",)
    max_output_tokens: int | str = "inf"
    metadata: dict[str, str] | None = None
    #: ``"none"``: out of band, not added to the conversation.
    conversation: str = "auto"
    #: The voice and output format of an audio response (``realtime.session_schema.AudioOutput``).
    audio_output: Any = None


def response_object(turn: Turn, status: str = "in_progress", reason: str | None = None,
                    items: tuple[object, ...] = (), error: ErrorInfo | None = None,
                    usage: ResponseUsage | None = None) -> ResponseObject:
    details = None
    if status != "in_progress":
        details = ResponseStatusDetails(type=status, reason=reason, error=error)  # type: ignore[arg-type]
    settings = turn.options or ResponseSettings()
    audio = ResponseAudio(output=settings.audio_output) if settings.audio_output is not None else None
    return ResponseObject(id=turn.response_id, status=status, status_details=details,  # type: ignore[arg-type]
                          output=items, usage=usage, output_modalities=settings.output_modalities,  # type: ignore[arg-type]
                          max_output_tokens=settings.max_output_tokens,  # type: ignore[arg-type]
                          metadata=settings.metadata, audio=audio)


def assistant_item(turn: Turn, text: str, status: str, audio: bool = True) -> MessageItem:
    part = ContentPart(type="output_audio", transcript=text) if audio else ContentPart(type="output_text", text=text)
    return MessageItem(id=turn.item_id, role="assistant", status=status,  # type: ignore[arg-type]
                       object="realtime.item", content=(part,) if text or status != "in_progress" else ())


def open_item(turn: Turn) -> list[object]:
    """The events that open the reply's message item and its content part."""
    turn.message_open = True
    item = assistant_item(turn, "", "in_progress", turn.spoken)
    part = ContentPart(type="audio" if turn.spoken else "text", transcript="")
    return [ev.ResponseOutputItemAdded(response_id=turn.response_id, item=item), ev.ConversationItemAdded(item=item),
            ev.ResponseContentPartAdded(response_id=turn.response_id, item_id=turn.item_id, part=part)]


def close_output(turn: Turn, status: str) -> tuple[list[object], tuple[object, ...]]:
    """The events that end what of the response is still open, and the response's final items.

    The message item (if opened and not closed yet, ``close_item``), then the function calls: a call
    still streaming ends ``incomplete`` unless ``status`` is ``completed``.
    """
    events: list[object] = []
    if turn.message_open and turn.message_item is None:
        events, turn.message_item = close_item(turn, status)
    items: tuple[object, ...] = () if turn.message_item is None else (turn.message_item,)
    if turn.calls is not None:
        events += turn.calls.finish("completed" if status == "completed" else "incomplete")
        items += turn.calls.items()
    return events, items


def close_item(turn: Turn, status: str) -> tuple[list[object], MessageItem]:
    """The events that end the reply's content part and item, and the final item.

    ``status``: ``completed``, or ``incomplete`` for a reply cut short (cancelled, failed,
    stopped at ``max_output_tokens``); the text is what was sent in deltas.
    """
    ids = {"response_id": turn.response_id, "item_id": turn.item_id}
    text = turn.text_sent.strip()
    events: list[object]
    if turn.spoken:
        events = [ev.ResponseOutputAudioDone(**ids), ev.ResponseOutputAudioTranscriptDone(**ids, transcript=text),
                  ev.ResponseContentPartDone(**ids, part=ContentPart(type="audio", transcript=text))]
    else:
        events = [ev.ResponseOutputTextDone(**ids, text=text),
                  ev.ResponseContentPartDone(**ids, part=ContentPart(type="text", text=text))]
    item = assistant_item(turn, text, status, turn.spoken)
    events += [ev.ResponseOutputItemDone(response_id=turn.response_id, item=item), ev.ConversationItemDone(item=item)]
    return events, item


def response_done(turn: Turn, status: str, reason: str | None = None, items: tuple[object, ...] = (),
                  error: ErrorInfo | None = None) -> ev.ResponseDone:
    """``response.done`` with the final items and the token counts: the LLM's own once it reported
    them; for a reply stopped before (cancelled, failed) the output tokens streamed so far (the
    prompt's count comes with the LLM's figures only: 0 then)."""
    stats = turn.generation
    if stats is not None and getattr(stats, "usage_reported", True):
        usage = ResponseUsage(input_tokens=stats.prompt_tokens, output_tokens=stats.completion_tokens,
                              total_tokens=stats.prompt_tokens + stats.completion_tokens)
    else:  # stopped before the LLM reported, or an LLM server that reports no usage
        usage = ResponseUsage(output_tokens=turn.output_tokens, total_tokens=turn.output_tokens)
    return ev.ResponseDone(response=response_object(turn, status, reason, items, error, usage))


def split_pcm(pcm: np.ndarray, rate: int, max_ms: int) -> list[np.ndarray]:
    """Cut int16 audio into pieces of at most ``max_ms`` ms."""
    step = max(1, rate * max_ms // 1000)
    return [pcm[i:i + step] for i in range(0, len(pcm), step)]


class Responder:
    """Runs replies for one session (stateless between replies)."""

    def __init__(self, cfg: Config, engines: Engines, turns: TurnControl, session_id: str = "",
                 room: Callable[[], Awaitable[bool]] | None = None) -> None:
        """``room``: awaited before each audio delta of a committed turn; False stops the speech
        (the session is closing). None: deltas never wait."""
        self.cfg = cfg
        self.engines = engines
        self.turns = turns
        self.session_id = session_id  # the session's conversation in the LLM (its KV sequence)
        self._room = room

    def _emit(self, turn: Turn, event: object) -> bool:
        return self.turns.emit(turn, event)

    async def run(self, turn: Turn, req: ReplyRequest) -> str:
        """Speak one reply; returns the full reply text. Raises CancelledError when interrupted.

        The item ends ``incomplete`` when the LLM stopped at the token limit
        (``turn.generation.finish_reason == "length"``).
        """
        ids = {"response_id": turn.response_id, "item_id": turn.item_id}
        turn.spoken = req.audio
        turn.calls = ReplyCalls(turn.response_id)
        self._emit(turn, ev.ResponseCreated(response=response_object(turn)))
        turn.response_started = True
        if not req.tools.tools:  # with tools, the message item opens at the first text (module doc)
            self._emit_all(turn, open_item(turn))
        clauses: asyncio.Queue = asyncio.Queue()
        llm_task = asyncio.create_task(self._generate(turn, req, clauses))
        turn.tasks.add(llm_task)
        try:
            if req.audio:
                await self._speak(turn, req, clauses, ids)
            else:
                await self._write_text(turn, clauses, ids)
            await llm_task
        finally:
            llm_task.cancel()
        stopped_at_limit = getattr(turn.generation, "finish_reason", None) == "length"
        if not turn.message_open and not turn.calls.calls:  # nothing at all: an empty message, as without tools
            self._emit_all(turn, open_item(turn))
        self._emit_all(turn, close_output(turn, "incomplete" if stopped_at_limit else "completed")[0])
        item = turn.message_item
        return item.content[0].content_text if item is not None and item.content else ""

    def _emit_all(self, turn: Turn, events: list[object]) -> None:
        for event in events:
            self._emit(turn, event)

    def _call(self, turn: Turn, delta: object) -> None:
        """A piece of a function call: the message item (text said before the call) ends first."""
        if turn.message_open and turn.message_item is None:
            events, turn.message_item = close_item(turn, "completed")
            self._emit_all(turn, events)
        index = int(turn.message_open) + len(turn.calls.calls)  # where a new call's item goes in the output
        self._emit_all(turn, turn.calls.feed(delta, output_index=index))

    def _text_started(self, turn: Turn) -> bool:
        """Open the message item at the reply's first text; False once a call has begun (text after a
        function call is not said: docs/protocol.md)."""
        if turn.calls.calls:
            return False
        if not turn.message_open:
            self._emit_all(turn, open_item(turn))
        return True

    async def _generate(self, turn: Turn, req: ReplyRequest, clauses: asyncio.Queue[str | None]) -> str:
        """LLM tokens -> clauses (queue); returns the whole text."""
        segmenter = ClauseSegmenter.from_config(self.cfg.tts)
        text: list[str] = []
        turn.trace.mark("llm_start")
        try:
            def done(stats) -> None:  # how it ended, what the LLM read, with how many other conversations
                turn.generation = stats
                turn.trace.info.update(llm_prompt_tokens=stats.prompt_tokens, llm_cached_tokens=stats.cached_tokens,
                                       llm_batch=getattr(stats, "first_batch", 1))
                if getattr(stats, "first_token_s", None) is not None:  # the engine's own, from its submit
                    turn.trace.info["llm_engine_first_token_ms"] = round(1000 * stats.first_token_s, 1)
                if getattr(stats, "total_s", None) is not None:  # submit to its last token (bench.tool_calls)
                    turn.trace.info["llm_engine_total_ms"] = round(1000 * stats.total_s, 1)

            extra = {"tools": req.tools.tools, "tool_choice": req.tools.tool_choice} if req.tools.tools else {}
            if turn.words is not None:  # the words' score, read from this request's prompt (its last message)
                extra["words"], turn.words = turn.words, None
            stream = self.engines.llm.stream(self.session_id, req.messages, req.max_tokens, turn.cancel,
                                             priority=req.priority, on_done=done, **extra)
            # Waiters run once this task waits, so after the stream's first step has sent the request.
            turn.reply_asked.set()
            async for token in stream:
                turn.trace.mark("llm_first_token")
                turn.output_tokens += 1  # one delta a decoding step (llm.batched); the stats correct it
                if not isinstance(token, str):  # a piece of a function call: after the text cut so far
                    if req.audio:
                        for clause in segmenter.flush():
                            clauses.put_nowait(clause)
                    clauses.put_nowait(token)
                    continue
                text.append(token)
                if not req.audio:
                    clauses.put_nowait(token)
                    continue
                for clause in segmenter.feed(token):
                    turn.trace.mark("first_clause")
                    clauses.put_nowait(clause)
            if req.audio:
                for clause in segmenter.flush():
                    turn.trace.mark("first_clause")
                    clauses.put_nowait(clause)
        finally:
            clauses.put_nowait(None)
        turn.trace.info["llm_tokens"] = len(text)
        return "".join(text).strip()

    async def _write_text(self, turn: Turn, clauses: asyncio.Queue, ids: dict) -> None:
        while (token := await clauses.get()) is not None:
            if not isinstance(token, str):
                self._call(turn, token)
                continue
            if not self._text_started(turn):
                continue
            if self._emit(turn, ev.ResponseOutputTextDelta(**ids, delta=token)):
                turn.text_sent += token

    async def _speak(self, turn: Turn, req: ReplyRequest, clauses: asyncio.Queue, ids: dict) -> None:
        voice = self.engines.voice(req.voice)
        options = voice.request(SynthesisOptions(sample_rate=req.output_rate, speed=None if req.speed == 1.0 else req.speed))
        index = 0
        while (clause := await clauses.get()) is not None:
            if not isinstance(clause, str):
                self._call(turn, clause)
                continue
            if not self._text_started(turn):
                continue
            start_ms = turn.audio_sent_ms
            delta = (" " if index else "") + clause
            if self._emit(turn, ev.ResponseOutputAudioTranscriptDelta(**ids, delta=delta)):
                turn.text_sent += delta
            priority = URGENT if index == 0 else NORMAL
            async for chunk in voice.speech.stream(clause, options, turn.cancel, priority):
                turn.trace.mark("tts_first_audio")
                for piece in split_pcm(chunk.pcm, chunk.sample_rate, self.cfg.server.audio_delta_ms):
                    if self._room is not None and turn.committed and not await self._room():
                        return  # the client stopped reading: the session is closing
                    self._emit(turn, ev.ResponseOutputAudioDelta(**ids, pcm=piece))
                    turn.audio_sent_ms += 1000 * len(piece) / chunk.sample_rate
            turn.clauses.append(SpokenClause(clause, start_ms, turn.audio_sent_ms))
            index += 1
