"""One session per connection: conversation history, session settings, VAD, the current turn.

Client events come in (already validated by the protocol core); server events go
out through a bounded outbox. Speech flow (server_vad / semantic_vad):

  audio -> 16 kHz (soxr) -> VoiceActivityDetector -> TurnTaking (pipeline/turn_taking.py, pure)
    -> decisions, performed here: start a speculative turn (ASR + LLM + TTS, events held back),
       commit it (speech_stopped + committed, held events flow), drop it, score the end of turn
       on the ``turn`` worker, barge in, pause / resume the reply.

Push-to-talk (``turn_detection: null``): audio accumulates until ``input_audio_buffer.commit``.
Turns are stopped through ``TurnControl`` (pipeline/turn.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from asr.vad import Pause, Resume, SpeechEnd, SpeechStart, VoiceActivityDetector
from pipeline.audio_in import ASR_RATE, InputAudio
from pipeline.engines import Engines
from pipeline.history import History
from pipeline.respond import ReplyRequest, Responder, close_item, response_done
from pipeline.stages import missing_stage_error
from pipeline.trace import Metrics, TraceSink, TurnTrace
from pipeline.tts_requests import TtsRequests
from pipeline.turn import Turn, TurnControl
from pipeline.turn_taking import (
    BargeIn, Commit, Decision, Discard, DropTurn, PauseReply, Policy, ResumeReply, Score, StartTurn, Transcribe,
    TurnTaking,
)
from pipeline.workers import BACKGROUND, NORMAL, URGENT
from realtime import events as ev
from realtime.items import ContentPart, ErrorInfo, MessageItem
from realtime.session_schema import default_session
from realtime.wire import ErrorCode, new_id
from voxloop.config import Config
from voxloop.errors import InvalidInput, VoxloopError

log = logging.getLogger(__name__)
#: Shortest push-to-talk commit that is transcribed, ms.
MIN_COMMIT_MS = 100


@dataclass(frozen=True)
class AfterSent:
    """An outbox entry that runs ``run()`` once every event queued before it is on the socket."""

    run: Callable[[], None]


class Session:
    def __init__(self, session_id: str, cfg: Config, engines: Engines, outbox: asyncio.Queue,
                 metrics: Metrics, traces: TraceSink,
                 close: Callable[[int, str], Awaitable[None]]) -> None:
        self.id = session_id
        self.cfg = cfg
        self.engines = engines
        self.outbox = outbox
        self.metrics = metrics
        self.traces = traces
        self._close = close
        self.closed = False
        self.turns = TurnControl(self._send)
        self.responder = Responder(cfg, engines, self.turns, session_id)
        self.history = History(max_chars=int((cfg.llm.n_ctx - cfg.llm.max_tokens) * 3))
        self.tts_requests = TtsRequests(engines, self._send, metrics)
        self.protocol: Any = None
        self.audio_in = InputAudio(cfg.limits.max_utterance_s)
        self._vad: VoiceActivityDetector | None = None
        self._taking: TurnTaking | None = None
        self._utterance = 0
        self._user_item: str | None = None
        self._speech_start_at: float | None = None  # monotonic time of the utterance's speech start
        self._speech_end_ms = 0  # stream time where the utterance's speech last ended
        self._turn_audio: np.ndarray | None = None  # the utterance up to its last pause or end
        self._side_tasks: set[asyncio.Task] = set()  # end-of-turn scores, transcripts over a paused reply
        self._last_turn: Turn | None = None
        self._partial_task: asyncio.Task | None = None
        self._partial_text = ""
        self._next_partial_ms = 0.0

    # ------------------------------------------------------------------ plumbing
    def start(self, protocol: Any) -> None:
        self.protocol = protocol
        protocol.session = default_session(self.cfg, self.id)
        self._configure()
        self._send(ev.SessionCreated(session=protocol.session))

    def _send(self, event: Any) -> None:
        if self.closed:
            return
        if isinstance(event, ev.ErrorEvent):
            self.metrics.errors.labels(code=event.error.code).inc()
        try:
            self.outbox.put_nowait(event)
        except asyncio.QueueFull:
            self.closed = True
            log.warning("%s: client is not reading (%d queued); closing", self.id, self.outbox.qsize())
            asyncio.get_running_loop().create_task(self._close(1008, "client is not reading its messages"))

    def _error(self, exc: BaseException, event_id: str | None = None) -> None:
        if not isinstance(exc, VoxloopError):
            log.exception("%s: internal error", self.id, exc_info=exc)
        self._send(ev.ErrorEvent.from_exception(exc, event_id))

    def on_sent(self, event: Any) -> None:
        """Called by the hub's writer after ``event`` went out on the socket."""
        if isinstance(event, ev.ResponseOutputAudioDelta):
            turn = self.turns.current
            if turn is not None and turn.response_id == event.response_id and turn.first_audio_at is None:
                turn.first_audio_at = time.monotonic()
                turn.trace.mark("first_audio_sent", turn.first_audio_at)
            self.metrics.audio_sent_s.inc(len(event.pcm) / self.protocol.session.output_rate)

    async def wait_idle(self) -> None:
        """Return when no turn is in flight (graceful drain)."""
        while (turn := self.turns.current) is not None and not turn.finished.is_set():
            await turn.finished.wait()

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        await self._close(code, reason)

    async def shutdown(self) -> None:
        self.closed = True
        self.turns.interrupt("client_cancelled")
        self.tts_requests.cancel_all()
        if self._partial_task is not None:
            self._partial_task.cancel()
        for task in self._side_tasks:
            task.cancel()
        if self.engines.llm is not None:
            self.engines.llm.release(self.id)  # frees the conversation's KV sequence

    # ------------------------------------------------------------------ dispatch
    def handle(self, event: Any) -> None:
        if isinstance(event, ev.ErrorEvent):  # the protocol core rejected a message
            self._send(event)
            return
        handler = _HANDLERS.get(type(event))
        refused = missing_stage_error(event, self.engines.stages)  # e.g. audio on a TTS-only server
        if handler is None or refused is not None:
            self._error(refused or InvalidInput(f"{event.type} is not supported",
                                                code=ErrorCode.UNSUPPORTED_EVENT_TYPE), event.event_id)
            return
        try:
            handler(self, event)
        except VoxloopError as exc:
            self._error(exc, event.event_id)

    def _on_session_update(self, event: ev.SessionUpdate) -> None:
        self._configure()
        self._send(ev.SessionUpdated(session=self.protocol.session))

    def _configure(self) -> None:
        """(Re)build the VAD and the turn-taking policy from the session's turn detection (None: push-to-talk)."""
        td = self.protocol.session.audio.input.turn_detection
        if td is None:
            self._vad = self._taking = None
            return
        vad, turn = self.cfg.vad, self.cfg.turn
        if td.type == "semantic_vad":
            policy = Policy.semantic_vad(td.eagerness or "auto", td.silence_duration_ms, vad.barge_in_min_ms,
                                         turn.max_silence_ms, turn.pause_on_speech, turn.pause_max_speech_ms)
            if self.engines.turn is None:  # no end-of-turn model on this server: silence alone
                policy = dataclasses.replace(policy, semantic=False)
        else:
            policy = Policy(silence_ms=td.silence_duration_ms, barge_in_min_ms=vad.barge_in_min_ms)
        vad_cfg = dataclasses.replace(
            vad, silence_duration_ms=policy.vad_silence_ms,
            prefix_padding_ms=td.prefix_padding_ms, aggressiveness=td.x_aggressiveness)
        if self._vad is None or self._taking is None or self._vad.config != vad_cfg:
            self._vad = VoiceActivityDetector(vad_cfg, ASR_RATE, self.cfg.limits.max_utterance_s)
            self._taking = TurnTaking(policy)  # a new stream clock
        self._taking.policy = policy

    # ------------------------------------------------------------------ audio in
    def _on_append(self, event: ev.InputAudioBufferAppend) -> None:
        pcm = self.audio_in.to_asr_rate(event.pcm, event.sample_rate)
        if self._vad is None:
            error = self.audio_in.buffer(pcm)
            if error is not None:
                self._error(error)
            return
        for vad_event in self._vad.feed(pcm):
            self._on_vad(vad_event)
        if self._vad is not None and self._taking is not None:
            self._perform(self._taking.tick(self._vad.stream_ms, self._assistant_audible()))
        self._maybe_partial()

    def _on_vad(self, event: Any) -> None:
        vad, taking = self._vad, self._taking
        assert vad is not None and taking is not None
        audible = self._assistant_audible()
        if isinstance(event, SpeechStart):
            decisions = taking.speech_started(event.t_ms, audible)
            pause = [d for d in decisions if isinstance(d, PauseReply)]
            self._perform([d for d in decisions if not isinstance(d, PauseReply)])  # about the last utterance
            self._utterance += 1
            self._user_item = new_id("item")
            self._speech_start_at = time.monotonic() - (vad.stream_ms - event.t_ms) / 1000
            self._partial_text = ""
            self._next_partial_ms = event.t_ms + self.cfg.asr.partial_interval_ms
            self._perform(pause)  # before speech_started: the client keeps the paused audio (docs/protocol.md)
            self._send(ev.InputAudioBufferSpeechStarted(audio_start_ms=event.t_ms, item_id=self._user_item))
        elif isinstance(event, Pause):
            self._turn_audio, self._speech_end_ms = event.audio, event.t_ms
            self._perform(taking.paused(event.t_ms, audible))
        elif isinstance(event, Resume):
            self._perform(taking.resumed(event.t_ms))
        elif isinstance(event, SpeechEnd):
            self._turn_audio, self._speech_end_ms = event.audio, event.t_ms
            self._perform(taking.speech_ended(event.t_ms, event.forced, audible))

    def _assistant_audible(self) -> bool:
        turn = self._reply_turn()
        return turn is not None and turn.still_audible()

    def _reply_turn(self) -> Turn | None:
        """The committed reply the user may be hearing (running, or finished but still playing)."""
        turn = self.turns.current or self._last_turn
        return turn if turn is not None and turn.committed else None

    # ------------------------------------------------------------------ turn-taking decisions
    def _perform(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            _DECISIONS[type(decision)](self, decision)

    def _do_start(self, d: StartTurn) -> None:
        if self._turn_audio is not None:
            self._start_voice_turn(self._turn_audio, committed=not d.speculative)

    def _do_commit(self, d: Commit) -> None:
        now = time.monotonic()
        speech_end_at = self._end_utterance(d.end_utterance, now)
        item = self._user_item or new_id("item")
        self._send(ev.InputAudioBufferCommitted(item_id=item))
        turn = self._speculative_turn()
        if turn is not None:
            turn.trace.mark("speech_end", speech_end_at)
            turn.trace.mark("vad_end", now)
            turn.trace.info["speculative"] = True
            self.turns.commit(turn)
            if turn.user_text is not None:
                self._add_user_message(turn)
        elif self._turn_audio is not None:
            self._start_voice_turn(self._turn_audio, committed=True, speech_end_at=speech_end_at, vad_end_at=now)

    def _do_discard(self, d: Discard) -> None:
        self._end_utterance(d.end_utterance, time.monotonic())
        self._do_drop(DropTurn(d.utterance))

    def _do_drop(self, d: DropTurn) -> None:
        turn = self._speculative_turn()
        if turn is not None:
            self.turns.interrupt("speech_resumed")
            self.traces.record(turn.trace, "discarded")

    def _end_utterance(self, reset_vad: bool, now: float) -> float:
        """``speech_stopped`` for the utterance (the VAD's too, if it still runs); returns when speech ended."""
        assert self._vad is not None
        if reset_vad:
            self._vad.reset()
        self._send(ev.InputAudioBufferSpeechStopped(audio_end_ms=self._speech_end_ms,
                                                    item_id=self._user_item or new_id("item")))
        return now - (self._vad.stream_ms - self._speech_end_ms) / 1000

    def _speculative_turn(self) -> Turn | None:
        turn = self.turns.current
        if turn is not None and not turn.committed and turn.utterance == self._utterance:
            return turn
        return None

    def _do_score(self, d: Score) -> None:
        audio, worker = self._turn_audio, self.engines.turn
        if audio is not None and worker is not None and self._taking is not None:
            self._side_task(self._score(worker, audio, self._taking, d.utterance))

    async def _score(self, worker: Any, audio: np.ndarray, taking: TurnTaking, utterance: int) -> None:
        t0 = time.monotonic()
        try:
            probability = await worker.submit(lambda model: model.score(audio), priority=URGENT)
        except VoxloopError as exc:
            log.warning("%s: end-of-turn score failed (%s); waiting for silence", self.id, exc)
            return
        turn = self._speculative_turn()
        if turn is not None:
            turn.trace.info.update(end_of_turn=round(probability, 3),
                                   end_of_turn_ms=round(1000 * (time.monotonic() - t0), 1))
        if self._vad is not None and self._taking is taking:  # not a stream of an older turn_detection
            self._perform(taking.scored(utterance, probability, self._vad.stream_ms, self._assistant_audible()))

    def _do_transcribe(self, d: Transcribe) -> None:
        if self._turn_audio is not None and self._taking is not None:
            self._side_task(self._transcribe_burst(self._turn_audio, self._taking, d.utterance))

    async def _transcribe_burst(self, audio: np.ndarray, taking: TurnTaking, utterance: int) -> None:
        """Words of speech over the paused reply (a cough has none)."""
        language = self._language()
        try:
            result = await self.engines.asr.transcribe(audio, language, priority=URGENT)
            text = result.text.strip()
        except VoxloopError:
            text = "?"  # unknown words: an interruption (the reply is cancelled, as without pausing)
        if self._taking is taking:
            self._perform(taking.transcribed(utterance, text))

    def _side_task(self, coro: Awaitable[None]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        task.add_done_callback(self._task_done)

    def _do_barge_in(self, d: BargeIn) -> None:
        paused = self._reply_turn()
        if paused is not None and paused.paused_at is not None:  # the client holds its audio: drop it
            self._send(ev.XOutputAudioBufferCleared(response_id=paused.response_id, item_id=paused.item_id,
                                                    audio_end_ms=round(paused.heard_ms())))
        self._interrupt("turn_detected")

    def _do_pause(self, d: PauseReply) -> None:
        turn = self._reply_turn()
        if turn is not None:
            heard = turn.pause_playback()
            self._send(ev.XOutputAudioBufferPaused(response_id=turn.response_id, item_id=turn.item_id,
                                                   audio_end_ms=round(heard)))

    def _do_resume(self, d: ResumeReply) -> None:
        turn = self._reply_turn()
        if turn is not None and turn.paused_at is not None:
            turn.resume_playback()
            self._send(ev.XOutputAudioBufferResumed(response_id=turn.response_id, item_id=turn.item_id))

    # ------------------------------------------------------------------ partial transcripts
    def _maybe_partial(self) -> None:
        vad = self._vad
        interval = self.cfg.asr.partial_interval_ms
        if (interval <= 0 or vad is None or not vad.in_speech or vad.stream_ms < self._next_partial_ms
                or self._partial_task is not None or not self.engines.asr.idle()):
            return  # partials are opportunistic: never queue behind real work
        audio = vad.utterance_so_far()
        if audio is None:
            return
        self._next_partial_ms = vad.stream_ms + interval
        self._partial_task = asyncio.create_task(self._partial(audio, self._utterance, self._user_item))

    async def _partial(self, audio: np.ndarray, utterance: int, item: str | None) -> None:
        try:
            language = self._language()
            result = await self.engines.asr.transcribe(audio, language, priority=BACKGROUND)
            text = result.text.strip()
            if utterance == self._utterance and item and text.startswith(self._partial_text) and text != self._partial_text:
                delta = text[len(self._partial_text):]
                self._partial_text = text
                self._send(ev.InputAudioTranscriptionDelta(item_id=item, delta=delta))
        except VoxloopError:
            pass  # a partial is a courtesy; the final transcript reports real errors
        finally:
            self._partial_task = None

    def _language(self) -> str | None:
        """The session's transcription language, else the server's ``asr.language``."""
        transcription = self.protocol.session.audio.input.transcription
        if transcription is not None and transcription.language:
            return transcription.language
        return self.cfg.asr.language

    # ------------------------------------------------------------------ turns
    def _new_turn(self, mode: str, committed: bool, utterance: int | None = None) -> Turn:
        trace = TurnTrace(0, self.id, mode)
        turn = self.turns.begin(new_id("resp"), new_id("item"), trace, committed, utterance)
        return turn

    def _start_voice_turn(self, audio: np.ndarray, committed: bool,
                          speech_end_at: float | None = None, vad_end_at: float | None = None) -> None:
        self._interrupt("turn_detected")
        mode = "server_vad" if self._vad is not None else "push_to_talk"
        turn = self._new_turn(mode, committed, self._utterance)
        if self._speech_start_at is not None and self._vad is not None:
            turn.trace.mark("speech_start", self._speech_start_at)
        if speech_end_at is not None:
            turn.trace.mark("speech_end", speech_end_at)
        if vad_end_at is not None:
            turn.trace.mark("vad_end", vad_end_at)
        turn.user_item_id = self._user_item or new_id("item")
        turn.trace.info["audio_ms"] = round(1000 * len(audio) / ASR_RATE)
        self._spawn(turn, self._voice_turn(turn, audio))

    def _spawn(self, turn: Turn, coro: Awaitable[None]) -> None:
        task = asyncio.create_task(coro, name=f"{self.id}-turn{turn.turn_id}")
        turn.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug, not a user error
            log.error("%s: %s failed", self.id, task.get_name(), exc_info=task.exception())

    def _user_message(self, item_id: str, status: str, transcript: str | None = None) -> MessageItem:
        return MessageItem(id=item_id, role="user", status=status, object="realtime.item",  # type: ignore[arg-type]
                           content=(ContentPart(type="input_audio", transcript=transcript),))

    async def _voice_turn(self, turn: Turn, audio: np.ndarray) -> None:
        item = turn.user_item_id or new_id("item")
        previous = turn.previous_item_id = self.history.last_item_id()
        self.turns.emit(turn, ev.ConversationItemAdded(item=self._user_message(item, "in_progress"),
                                                       previous_item_id=previous))
        try:
            turn.trace.mark("asr_start")
            language = self._language()
            priority = NORMAL if turn.committed else BACKGROUND
            result = await self.engines.asr.transcribe(audio, language, priority=priority, cancel=turn.cancel)
            turn.trace.mark("asr_final")
            text = result.text.strip()
            turn.user_text = text
            self.turns.emit(turn, ev.InputAudioTranscriptionCompleted(
                item_id=item, transcript=text, usage=ev.TranscriptionUsage(seconds=len(audio) / ASR_RATE)))
            self.turns.emit(turn, ev.ConversationItemDone(item=self._user_message(item, "completed", text),
                                                          previous_item_id=previous))
            if not text:
                await turn.released.wait()
                self._finish(turn, "empty_transcript")
                return
            if turn.committed:
                self._add_user_message(turn)
            await self._reply(turn, pending_user=None if turn.committed else text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, the session goes on
            self._fail(turn, exc)

    def _add_user_message(self, turn: Turn) -> None:
        if turn.user_added or turn.user_text is None or turn.user_item_id is None:
            return
        turn.user_added = True
        self.history.add("user", turn.user_text, turn.user_item_id)

    async def _reply(self, turn: Turn, pending_user: str | None = None, instructions: str | None = None,
                     audio: bool | None = None, add_to_history: bool = True) -> None:
        session = self.protocol.session
        system = instructions or session.instructions or self.cfg.llm.system_prompt
        messages = self.history.messages(system, pending_user)
        max_tokens = self.cfg.llm.max_tokens
        if session.max_output_tokens != "inf":
            max_tokens = min(max_tokens, int(session.max_output_tokens))
        wants_audio = session.output_modalities == ("audio",) if audio is None else audio
        req = ReplyRequest(messages, max_tokens, session.output_rate, audio=wants_audio)
        text = await self.responder.run(turn, req)
        # A speculative turn may finish before the user has; history changes wait for the commit.
        await turn.released.wait()
        if pending_user is not None:
            self._add_user_message(turn)
        if add_to_history and text:
            turn.history_index = self.history.add("assistant", text, turn.item_id)
        self._finish(turn, "incomplete" if getattr(turn.generation, "finish_reason", None) == "length"
                     else "completed")

    def _finish(self, turn: Turn, status: str, error: ErrorInfo | None = None) -> None:
        """End ``turn``; a started response ends with ``response.done`` carrying ``status``
        (completed | incomplete | failed) and its final item."""
        if not self.turns.is_current(turn):
            return
        if turn.response_started:
            item = close_item(turn, "completed" if status == "completed" else "incomplete")[1]
            reason = "max_output_tokens" if status == "incomplete" else None
            self.turns.emit(turn, response_done(turn, status, reason, (item,), error))
        self.turns.finish(turn, status)
        self._last_turn = turn
        turn.trace.mark("done")
        self._record(turn, status)

    def _record(self, turn: Turn, status: str) -> None:
        """Write the turn's trace once what it queued is sent (so ``first_audio_sent`` is real)."""

        def record() -> None:
            summary = self.traces.record(turn.trace, status)
            if self.cfg.trace.send_to_client and turn.committed and status != "empty_transcript":
                self._send(ev.XTurnMetrics(response_id=turn.response_id, item_id=turn.item_id, metrics=summary))

        self._send(AfterSent(record))

    def _fail(self, turn: Turn, exc: BaseException) -> None:
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
            self.turns.emit(turn, ev.ConversationItemDone(item=self._user_message(item, "completed"),
                                                          previous_item_id=turn.previous_item_id))
        elif turn.response_started:
            for event in close_item(turn, "incomplete")[0]:
                self.turns.emit(turn, event)
        self._finish(turn, "failed", error)

    def _interrupt(self, reason: str, by_voice: bool = True) -> Turn | None:
        """Barge-in / cancel: stop the current turn, tell the client, keep only heard text.

        ``by_voice``: the user spoke over the reply, so a finished reply that is still
        playing is cut in history too (the client stops playback on speech_started).
        """
        turn = self.turns.interrupt(reason)
        if turn is None:
            last = self._last_turn
            if by_voice and last is not None and last.still_audible():
                self._truncate_history(last, last.heard_ms())
                last.played_ms = last.heard_ms()  # no longer audible: the client stops playback
                self._reply_ended()
            return None
        if not turn.committed:
            self.traces.record(turn.trace, "discarded")
            return turn
        self._reply_ended()
        self._last_turn = turn
        turn.played_ms = turn.heard_ms()  # frozen: the client stops playback on speech_started
        heard = turn.heard_text()
        if heard:
            turn.history_index = self.history.add("assistant", heard, turn.item_id)
        if turn.response_started:  # its events are dropped from now on: these go out directly
            events, item = close_item(turn, "incomplete")
            for event in events:
                self._send(event)
            self._send(response_done(turn, "cancelled", reason, (item,)))
        turn.trace.mark("done")
        self._record(turn, "cancelled")
        return turn

    def _reply_ended(self) -> None:
        if self._taking is not None:
            self._taking.reply_ended()

    def _truncate_history(self, turn: Turn, heard_ms: float) -> None:
        if turn.history_index is not None:
            self.history.truncate(turn.history_index, turn.item_id, turn.heard_text(heard_ms))

    # ------------------------------------------------------------------ client events
    def _on_commit(self, event: ev.InputAudioBufferCommit) -> None:
        if self._vad is not None and self._taking is not None:
            audio = self._vad.utterance_so_far()
            self._vad.reset()
            self._perform(self._taking.cleared())
        else:
            audio = self.audio_in.take()
        if audio is None or len(audio) < ASR_RATE * MIN_COMMIT_MS // 1000:
            raise InvalidInput(f"input audio buffer holds less than {MIN_COMMIT_MS} ms of audio",
                               code=ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY)
        self._utterance += 1
        self._user_item = new_id("item")
        self._send(ev.InputAudioBufferCommitted(item_id=self._user_item))
        self._start_voice_turn(audio, committed=True, vad_end_at=time.monotonic())

    def _on_clear(self, event: ev.InputAudioBufferClear) -> None:
        self.audio_in.clear()
        if self._vad is not None and self._taking is not None:
            self._vad.reset()
            self._perform(self._taking.cleared())
        self._send(ev.InputAudioBufferCleared())

    def _on_item_create(self, event: ev.ConversationItemCreate) -> None:
        item = event.item
        text = " ".join(p.content_text for p in item.content).strip()
        item_id = item.id or new_id("item")
        self.history.add(item.role, text, item_id)
        done = dataclasses.replace(item, id=item_id, status="completed", object="realtime.item")
        self._send(ev.ConversationItemAdded(item=done, previous_item_id=event.previous_item_id))
        self._send(ev.ConversationItemDone(item=done, previous_item_id=event.previous_item_id))

    def _on_response_create(self, event: ev.ResponseCreate) -> None:
        current = self.turns.current
        if current is not None and current.committed and not current.finished.is_set():
            if current.trace.mode == "push_to_talk" and "llm_start" not in current.trace.t:
                # GA clients send response.create after commit; voxloop already answers
                # the commit, so this request joins that response (documented).
                return
            raise InvalidInput("a response is already in progress; cancel it first",
                               code=ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
        self._interrupt("turn_detected", by_voice=False)  # drops a speculative turn, if any
        opts = event.response
        turn = self._new_turn("text", committed=True)
        turn.trace.mark("vad_end")
        audio = None if opts is None or opts.output_modalities is None else opts.output_modalities == ("audio",)
        self._spawn(turn, self._guarded_reply(
            turn, instructions=opts.instructions if opts else None, audio=audio,
            add_to_history=not (opts is not None and opts.conversation == "none")))

    async def _guarded_reply(self, turn: Turn, **kwargs: Any) -> None:
        try:
            await self._reply(turn, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self._fail(turn, exc)

    def _on_response_cancel(self, event: ev.ResponseCancel) -> None:
        current = self.turns.current
        if current is None or not current.committed or (
                event.response_id is not None and event.response_id != current.response_id):
            raise InvalidInput("no active response to cancel", code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE)
        self._interrupt("client_cancelled")

    def _find_turn(self, item_id: str) -> Turn | None:
        for turn in (self.turns.current, self._last_turn):
            if turn is not None and turn.item_id == item_id:
                return turn
        return None

    def _on_truncate(self, event: ev.ConversationItemTruncate) -> None:
        turn = self._find_turn(event.item_id)
        if turn is None and not self.history.has_item(event.item_id):
            raise InvalidInput(f"no assistant item {event.item_id}", code=ErrorCode.ITEM_NOT_FOUND)
        if turn is not None:
            turn.played_ms = float(event.audio_end_ms)
            self._truncate_history(turn, event.audio_end_ms)
        self._send(ev.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                                audio_end_ms=event.audio_end_ms))

    def _on_playback(self, event: ev.XPlayback) -> None:
        turn = self._find_turn(event.item_id)
        if turn is None:
            return  # a late report about an old reply: nothing left to update
        if turn.played_ms is None and event.audio_end_ms > 0:
            turn.trace.mark("playback_start", time.monotonic() - event.audio_end_ms / 1000)
        turn.played_ms = max(turn.played_ms or 0.0, float(event.audio_end_ms))

    def _on_tts_speak(self, event: ev.XTtsSpeak) -> None:
        try:
            self.tts_requests.start(event, self.protocol.session.output_rate)
        except VoxloopError as exc:  # every request ends with x.tts.done, refused ones too
            self._error(exc, event.event_id)
            self._send(ev.XTtsDone(request_id=event.request_id, status="failed", error=ev.error_info(exc)))

    def _on_tts_cancel(self, event: ev.XTtsCancel) -> None:
        self.tts_requests.cancel(event.request_id)


_HANDLERS: dict[type, Callable[[Session, Any], None]] = {
    ev.SessionUpdate: Session._on_session_update,
    ev.InputAudioBufferAppend: Session._on_append,
    ev.InputAudioBufferCommit: Session._on_commit,
    ev.InputAudioBufferClear: Session._on_clear,
    ev.ConversationItemCreate: Session._on_item_create,
    ev.ConversationItemTruncate: Session._on_truncate,
    ev.ResponseCreate: Session._on_response_create,
    ev.ResponseCancel: Session._on_response_cancel,
    ev.XPlayback: Session._on_playback,
    ev.XTtsSpeak: Session._on_tts_speak,
    ev.XTtsCancel: Session._on_tts_cancel,
}

_DECISIONS: dict[type, Callable[[Session, Any], None]] = {
    StartTurn: Session._do_start,
    Commit: Session._do_commit,
    DropTurn: Session._do_drop,
    Discard: Session._do_discard,
    Score: Session._do_score,
    Transcribe: Session._do_transcribe,
    BargeIn: Session._do_barge_in,
    PauseReply: Session._do_pause,
    ResumeReply: Session._do_resume,
}
