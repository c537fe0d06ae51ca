"""Turn control: the one place that stops turns (barge-in, cancel, speculation).

*When* to stop, pause or commit is decided by ``pipeline/turn_taking.py`` (pure); this
module carries it out.

Every reply belongs to a ``Turn`` with an id. ``TurnControl.interrupt()`` bumps the
id, sets the turn's cancel flag (the LLM and TTS workers check it between tokens
and chunks), cancels its asyncio tasks and returns the turn so the session can say
``response.done`` (cancelled) and keep in history only what the client heard.
Anything carrying an old turn id is dropped on arrival (``is_current``).

A turn can start *speculatively* (ASR + LLM + TTS begin at a short pause in speech):
its events are held back until ``commit()``; if speech resumes it is interrupted
silently and nothing of it ever reaches the client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.trace import TurnTrace


@dataclass
class SpokenClause:
    """A clause of the reply and where its audio sits in the response's audio stream (ms)."""

    text: str
    start_ms: float
    end_ms: float


@dataclass
class Turn:
    """One reply in the making."""

    turn_id: int
    response_id: str
    item_id: str
    trace: TurnTrace
    committed: bool
    cancel: threading.Event = field(default_factory=threading.Event)
    tasks: set[asyncio.Task] = field(default_factory=set)
    held: list[Any] = field(default_factory=list)
    clauses: list[SpokenClause] = field(default_factory=list)
    #: Reply audio handed to the client so far, ms.
    audio_sent_ms: float = 0.0
    #: Client-reported playback position, ms (None until the first ``x.playback``).
    played_ms: float | None = None
    #: Monotonic time of the first audio sent (to estimate playback without reports).
    first_audio_at: float | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the turn is committed (at once for turns that start committed).
    released: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the reply's LLM request is sent, or it is known that none will be (no words, a
    #: transcription-only turn): the words' end-of-turn score is asked after it (voice_input).
    reply_asked: asyncio.Event = field(default_factory=asyncio.Event)
    #: The words' end-of-turn score, asked with the reply's LLM request when it is set before that
    #: request goes out (voice_input sets it as the transcript is heard; the reply takes it).
    words: asyncio.Future | None = None
    status: str = "in_progress"
    reason: str | None = None
    #: Set for turns started from speech: identifies the utterance they answer.
    utterance: int | None = None
    #: The user item this turn answers (voice turns), its transcript once known, and whether
    #: that transcript is in the history yet.
    user_item_id: str | None = None
    user_text: str | None = None
    user_added: bool = False
    #: The item before the user item (``previous_item_id`` of its events).
    previous_item_id: str | None = None
    #: Where the reply sits in the history (to truncate it to what was heard).
    history_index: int | None = None
    #: Monotonic time playback was paused (speech over the reply), None while playing.
    paused_at: float | None = None
    #: The user spoke over the reply and it was stopped: the client plays no more of it.
    stopped: bool = False
    #: ``response.created`` was emitted: the response must end with ``response.done``.
    response_started: bool = False
    #: The reply is spoken (False: a text-only reply).
    spoken: bool = True
    #: A voice turn that only transcribes (``turn_detection.create_response`` false): the
    #: client asks for a response itself.
    transcribe_only: bool = False
    #: Reply text sent so far in transcript or text deltas.
    text_sent: str = ""
    #: How the LLM's generation ended, once it has (``finish_reason``, ``prompt_tokens``,
    #: ``completion_tokens``; e.g. ``llm.replies.GenerationStats``). None while running or unknown.
    generation: Any = None
    #: The assistant message item was opened (``response.output_item.added``): at once, or with tools
    #: offered at the reply's first text (a reply that only calls a function has no message item).
    message_open: bool = False
    #: The message item as it ended (set when it is closed: before a function call, or at the end).
    message_item: Any = None
    #: The response's function calls (``pipeline.tool_calls.ReplyCalls``); None before the reply starts.
    calls: Any = None
    #: LLM text deltas received so far (``response.done`` usage of a reply stopped before the LLM
    #: reported its figures).
    output_tokens: int = 0
    #: ``response.create`` options of this response (``response_object`` reports them); None: the session's.
    options: Any = None

    def heard_ms(self, now: float | None = None) -> float:
        """How much of the reply the user has heard: reported, else estimated from wall time."""
        if self.played_ms is not None:
            return min(self.played_ms, self.audio_sent_ms)
        if self.first_audio_at is None:
            return 0.0
        if self.paused_at is not None:
            now = self.paused_at
        elapsed = ((time.monotonic() if now is None else now) - self.first_audio_at) * 1000
        return min(elapsed, self.audio_sent_ms)

    def pause_playback(self, now: float | None = None) -> float:
        """The client stopped playing this reply; returns the ms heard (frozen until resumed)."""
        if self.paused_at is None:
            self.paused_at = time.monotonic() if now is None else now
        return self.heard_ms()

    def resume_playback(self, now: float | None = None) -> None:
        """The client plays on from where it paused (the wall-clock estimate skips the pause)."""
        if self.paused_at is None:
            return
        if self.first_audio_at is not None:
            self.first_audio_at += (time.monotonic() if now is None else now) - self.paused_at
        self.paused_at = None

    def heard_text(self, heard_ms: float | None = None) -> str:
        """Text of the audio heard: whole clauses, plus the heard share of a clause cut mid-way."""
        ms = self.heard_ms() if heard_ms is None else heard_ms
        out: list[str] = []
        for c in self.clauses:
            if ms >= c.end_ms:
                out.append(c.text)
            elif ms > c.start_ms:
                words = c.text.split()
                share = (ms - c.start_ms) / max(c.end_ms - c.start_ms, 1e-6)
                keep = int(len(words) * share)
                if keep:
                    out.append(" ".join(words[:keep]))
                break
            else:
                break
        return " ".join(out)

    def full_text(self) -> str:
        return " ".join(c.text for c in self.clauses)

    def still_audible(self, now: float | None = None) -> bool:
        """True while the client may still be playing this reply."""
        if self.stopped:
            return False
        if not self.finished.is_set():
            return True
        return self.heard_ms(now) < self.audio_sent_ms - 1


class TurnControl:
    """Owns the current turn of a session."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self._emit = emit
        self._next_id = 0
        self.current: Turn | None = None

    def begin(self, response_id: str, item_id: str, trace: TurnTrace, committed: bool,
              utterance: int | None = None) -> Turn:
        """Start a new turn (the caller interrupts any current one first)."""
        self._next_id += 1
        turn = Turn(self._next_id, response_id, item_id, trace, committed, utterance=utterance)
        trace.turn_id = turn.turn_id
        if committed:
            turn.released.set()
        self.current = turn
        return turn

    @property
    def running(self) -> Turn | None:
        """The current turn while it is not finished (a finished one stays ``current`` until the next)."""
        turn = self.current
        return turn if turn is not None and not turn.finished.is_set() else None

    def is_current(self, turn: Turn | int) -> bool:
        tid = turn if isinstance(turn, int) else turn.turn_id
        return self.current is not None and self.current.turn_id == tid

    def emit(self, turn: Turn, event: Any) -> bool:
        """Send ``event`` for ``turn`` — held while speculative, dropped if the turn is stale."""
        if not self.is_current(turn) or turn.status == "cancelled":
            return False
        if not turn.committed:
            turn.held.append(event)
            return True
        self._emit(event)
        return True

    def commit(self, turn: Turn) -> None:
        """Release a speculative turn: send what it held, in order; from now on events flow."""
        if turn.committed:
            return
        turn.committed = True
        held, turn.held = turn.held, []
        for event in held:
            self._emit(event)
        turn.released.set()

    def interrupt(self, reason: str, turn: Turn | None = None) -> Turn | None:
        """Stop ``turn`` (default: the current one). Returns it if it was still running."""
        turn = turn or self.current
        if turn is None or turn.finished.is_set():
            return None
        turn.status, turn.reason = "cancelled", reason
        turn.cancel.set()
        me = asyncio.current_task()
        for task in turn.tasks:
            if task is not me:
                task.cancel()
        turn.held.clear()
        turn.finished.set()
        if self.current is turn:
            self.current = None  # its id is now stale: emit() drops anything it still produces
        return turn

    def finish(self, turn: Turn, status: str = "completed") -> None:
        if not turn.finished.is_set():
            turn.status = status
            turn.finished.set()
