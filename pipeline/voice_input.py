"""The user's voice in one session: audio -> VAD -> turn taking -> voice turns.

  audio -> 16 kHz (soxr) -> VoiceActivityDetector -> TurnTaking (pipeline/turn_taking.py, pure)
    -> decisions, performed here: start a speculative turn (ASR + LLM + TTS, events held back),
       commit it (speech_stopped + committed, held events flow), drop it, score the end of turn
       on the ``turn`` worker, transcribe speech over a paused reply, barge in, pause / resume
       the reply.

Push-to-talk (``turn_detection: null``): audio accumulates until ``input_audio_buffer.commit``.
Partial transcripts go out while the user speaks, when the ASR has nothing better to do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from asr.vad import Pause, Resume, SpeechEnd, SpeechStart, VoiceActivityDetector
from pipeline.audio_in import ASR_RATE, InputAudio
from pipeline.conversation import Conversation
from pipeline.engines import Engines
from pipeline.tool_calls import tool_request
from pipeline.turn import Turn
from pipeline.turn_taking import (
    BargeIn, Commit, Decision, Discard, DropTurn, Mend, PauseReply, Policy, ResumeReply, Score, ScoreWords, StartTurn,
    Transcribe, TurnTaking,
)
from pipeline.workers import BACKGROUND, NORMAL, PARTIAL, URGENT
from realtime import events as ev
from realtime.wire import ErrorCode, new_id
from base.config import Config
from base.errors import InvalidInput, ProtocolError, VoxloopError

log = logging.getLogger(__name__)
#: Shortest push-to-talk commit that is transcribed, ms.
MIN_COMMIT_MS = 100


class VoiceInput:
    """VAD, turn taking and voice turns of one session; ``settings()`` is the session object."""

    def __init__(self, cfg: Config, engines: Engines, conversation: Conversation, send: Callable[[Any], None],
                 error: Callable[[BaseException], None], settings: Callable[[], Any]) -> None:
        self.cfg = cfg
        self.engines = engines
        self.conv = conversation
        self._send = send
        self._error = error
        self._settings = settings
        self.audio_in = InputAudio(cfg.limits.max_utterance_s)
        self._vad: VoiceActivityDetector | None = None
        self._taking: TurnTaking | None = None
        self._mode = "push_to_talk"
        self._utterance = 0
        self._user_item: str | None = None
        self._speech_start_at: float | None = None  # monotonic time of the utterance's speech start
        self._speech_end_ms = 0  # stream time where the utterance's speech last ended
        self._turn_audio: np.ndarray | None = None  # the utterance up to its last pause or end
        self._pauses = 0  # VAD pauses and resumes so far: a score asked before the last one is stale
        self._side_tasks: set[asyncio.Task] = set()  # end-of-turn scores, transcripts over a paused reply
        self._partial_task: asyncio.Task | None = None
        self._partial_text = ""
        self._next_partial_ms = 0.0
        self._idle_from_ms: float | None = None  # stream time the last response stopped playing
        self._audio_of: tuple[Turn, np.ndarray] | None = None  # the last voice turn started, its audio
        self._mended: np.ndarray | None = None  # audio of the turn this utterance continues (Mend)
        conversation.on_reply_stopped = self._reply_stopped

    def configure(self) -> None:
        """(Re)build the VAD and the turn-taking policy from the session's turn detection (None: push-to-talk)."""
        td = self._settings().audio.input.turn_detection
        if td is None:
            self._vad = self._taking = None
            self._mode = "push_to_talk"
            return
        vad, turn = self.cfg.vad, self.cfg.turn
        # turn.asr_pause_ms: the VAD pauses that early (the speculative turn starts), the score waits
        # for turn.pause_ms, both in whole VAD frames.
        pause_ms, asr_pause_ms = (-(-ms // vad.frame_ms) * vad.frame_ms
                                  for ms in (turn.pause_ms, min(turn.asr_pause_ms or turn.pause_ms, turn.pause_ms)))
        if td.type == "semantic_vad":
            policy = Policy.semantic_vad(td.eagerness or "auto", td.silence_duration_ms, vad.barge_in_min_ms,
                                         turn.max_silence_ms, turn.pause_on_speech, turn.pause_max_speech_ms,
                                         interrupt=td.interrupt_response,
                                         score_pause_ms=pause_ms if asr_pause_ms < pause_ms else 0,
                                         score_early=turn.score_early,
                                         words_threshold=turn.words_threshold if self._scores_words() else None,
                                         long_stop_ms=turn.long_stop_ms, words_sure=turn.words_sure,
                                         mend_ms=turn.mend_ms)
            if self.engines.turn is None:  # no end-of-turn model on this server: silence alone
                policy = dataclasses.replace(policy, semantic=False, words_threshold=None)
        else:
            policy = Policy(silence_ms=td.silence_duration_ms, barge_in_min_ms=vad.barge_in_min_ms,
                            interrupt=td.interrupt_response, mend_ms=turn.mend_ms)
        self._mode = td.type
        vad_cfg = dataclasses.replace(
            vad, silence_duration_ms=policy.vad_silence_ms,
            speculative_pause_ms=asr_pause_ms if policy.semantic else vad.speculative_pause_ms,
            prefix_padding_ms=td.prefix_padding_ms, aggressiveness=td.x_aggressiveness)
        if self._vad is None or self._taking is None or self._vad.config != vad_cfg:
            self._vad = VoiceActivityDetector(vad_cfg, ASR_RATE, self.cfg.limits.max_utterance_s)
            self._taking = TurnTaking(policy)  # a new stream clock
        self._taking.policy = policy

    def _scores_words(self) -> bool:
        return self.cfg.turn.score_words and bool(getattr(self.engines.llm, "scores_words", False))

    def shutdown(self) -> None:
        if self._partial_task is not None:
            self._partial_task.cancel()
        for task in self._side_tasks:
            task.cancel()

    # ------------------------------------------------------------------ client events
    def append(self, event: ev.InputAudioBufferAppend) -> None:
        pcm = self.audio_in.to_asr_rate(event.pcm, event.sample_rate)
        if self._vad is None:
            error = self.audio_in.buffer(pcm)
            if error is not None:
                self._error(error)
            return
        for vad_event in self._vad.feed(pcm):
            self._on_vad(vad_event)
        if self._vad is not None and self._taking is not None:
            self._perform(self._taking.tick(self._vad.stream_ms, self.conv.audible()))
        self._maybe_partial()
        self._check_idle()

    def commit(self, event: ev.InputAudioBufferCommit) -> None:
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

    def clear(self, event: ev.InputAudioBufferClear) -> None:
        self.audio_in.clear()
        if self._vad is not None and self._taking is not None:
            self._vad.reset()
            self._perform(self._taking.cleared())
        self._send(ev.InputAudioBufferCleared())

    # ------------------------------------------------------------------ VAD events in, decisions out
    def _on_vad(self, event: Any) -> None:
        vad, taking = self._vad, self._taking
        assert vad is not None and taking is not None
        audible = self.conv.audible()
        if isinstance(event, SpeechStart):
            decisions = taking.speech_started(event.t_ms, audible)
            pause = [d for d in decisions if isinstance(d, PauseReply)]
            self._perform([d for d in decisions if not isinstance(d, PauseReply)])  # about the last utterance
            self._utterance += 1
            self._user_item = new_id("item")
            self._speech_start_at = time.monotonic() - (vad.stream_ms - event.t_ms) / 1000
            self._partial_text = ""
            self._mended = None
            self._next_partial_ms = event.t_ms + self.cfg.asr.partial_interval_ms
            self._perform(pause)  # before speech_started: the client keeps the paused audio (docs/protocol.md)
            self._send(ev.InputAudioBufferSpeechStarted(audio_start_ms=event.t_ms, item_id=self._user_item))
        elif isinstance(event, Pause):
            self._pauses += 1
            self._turn_audio, self._speech_end_ms = event.audio, event.t_ms
            self._perform(taking.paused(event.t_ms, audible))
        elif isinstance(event, Resume):
            self._pauses += 1
            self._perform(taking.resumed(event.t_ms))
        elif isinstance(event, SpeechEnd):
            self._turn_audio, self._speech_end_ms = event.audio, event.t_ms
            self._perform(taking.speech_ended(event.t_ms, event.forced, audible))

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
            self.conv.turns.commit(turn)
            if turn.user_text is not None:
                self.conv.add_user_message(turn)
        elif self._turn_audio is not None:
            self._start_voice_turn(self._turn_audio, committed=True, speech_end_at=speech_end_at, vad_end_at=now)

    def _do_discard(self, d: Discard) -> None:
        self._end_utterance(d.end_utterance, time.monotonic())
        self._do_drop(DropTurn(d.utterance))

    def _do_drop(self, d: DropTurn) -> None:
        turn = self._speculative_turn()
        if turn is not None:
            self.conv.turns.interrupt("speech_resumed")
            self.conv.traces.record(turn.trace, "discarded")

    def _end_utterance(self, reset_vad: bool, now: float) -> float:
        """``speech_stopped`` for the utterance (the VAD's too, if it still runs); returns when speech ended."""
        assert self._vad is not None
        if reset_vad:
            self._vad.reset()
        self._send(ev.InputAudioBufferSpeechStopped(audio_end_ms=self._speech_end_ms,
                                                    item_id=self._user_item or new_id("item")))
        return now - (self._vad.stream_ms - self._speech_end_ms) / 1000

    def _speculative_turn(self) -> Turn | None:
        turn = self.conv.turns.current
        if turn is not None and not turn.committed and turn.utterance == self._utterance:
            return turn
        return None

    def _judged_audio(self) -> np.ndarray | None:
        """Audio to score or transcribe at the short pause: the utterance as a ``Pause`` carries it
        (also when the VAD's own pause came earlier, ``turn.asr_pause_ms``)."""
        audio = self._vad.pause_audio() if self._vad is not None else None
        return self._turn_audio if audio is None else audio

    def _do_score(self, d: Score) -> None:
        # An early score (at the VAD's pause) hears what that pause carried, like its ASR; a later
        # one the utterance up to now (the longer silence of turn.pause_ms).
        audio = self._turn_audio if d.early else self._judged_audio()
        worker = self.engines.turn
        if audio is not None and worker is not None and self._taking is not None:
            self._side_task(self._score(worker, audio, self._taking, d.utterance, self._pauses))

    async def _score(self, worker: Any, audio: np.ndarray, taking: TurnTaking, utterance: int, pauses: int) -> None:
        t0 = time.monotonic()
        try:
            probability = await worker.submit(lambda model: model.score(audio), priority=URGENT)
        except VoxloopError as exc:
            log.warning("%s: end-of-turn score failed (%s); waiting for silence", self.conv.id, exc)
            return
        if pauses != self._pauses:
            # Speech resumed after the pause it scored (asked there with turn.score_early): the
            # utterance's number is the same at its next pause, its audio is not.
            return
        turn = self._speculative_turn()
        if turn is not None:
            turn.trace.info.update(end_of_turn=round(probability, 3),
                                   end_of_turn_ms=round(1000 * (time.monotonic() - t0), 1))
        if self._vad is not None and self._taking is taking:  # not a stream of an older turn_detection
            self._perform(taking.scored(utterance, probability, self._vad.stream_ms, self.conv.audible()))

    def _heard(self, turn: Turn, text: str, language: str | None) -> None:
        """The speculative turn's transcript, for the turn-taking decision (its last words)."""
        taking = self._taking
        if taking is not None and self._vad is not None and turn.utterance == self._utterance:
            # The turn is of the current utterance: the machine's own number for it (a client commit
            # or a new machine after a session.update numbers utterances apart from this class).
            self._perform(taking.heard(taking.utterance, text, language, self._vad.stream_ms,
                                       self.conv.audible()))

    def _do_score_words(self, d: ScoreWords) -> None:
        if self._taking is None:
            return
        turn, asked = self._speculative_turn(), None
        if turn is not None and not turn.reply_asked.is_set():
            # Asked with the speculative reply (respond takes it): its prompt holds the words, so the
            # LLM reads their score from that prompt's logits in the step that reads it (llm/batched.py).
            asked = turn.words = asyncio.get_running_loop().create_future()
        self._side_task(self._score_words(self._taking, d, self._pauses, turn, asked))

    async def _score_words(self, taking: TurnTaking, d: ScoreWords, pauses: int, turn: Turn | None,
                           asked: asyncio.Future | None) -> None:
        t0 = time.monotonic()
        if turn is not None:
            await _first((turn.reply_asked, turn.finished))
        try:
            if asked is not None and turn is not None and turn.words is not asked:  # the reply took it
                # (a turn stopped before its request went out leaves it unanswered: no score)
                await _first((turn.finished,), asked)
                probability = asked.result() if asked.done() else None
            else:
                if turn is not None and turn.words is asked:
                    turn.words = None  # no reply asked (an empty transcript): a probe of its own
                probability = await self._score_words_alone(d.text)
        except VoxloopError as exc:
            log.warning("%s: end-of-turn score of the words failed (%s); the sound decides", self.conv.id, exc)
            probability = None
        if pauses != self._pauses or self._taking is not taking or self._vad is None:
            return  # speech resumed after the pause it scored, or a new turn_detection
        if turn is not None and probability is not None:
            turn.trace.info.update(words_end_of_turn=round(probability, 4),
                                   words_end_of_turn_ms=round(1000 * (time.monotonic() - t0), 1))
        self._perform(taking.words_scored(d.utterance, probability, self._vad.stream_ms, self.conv.audible()))

    async def _score_words_alone(self, text: str) -> float | None:
        """The words' score asked on its own, after the conversation as the reply would read it."""
        session = self._settings()  # the reply's prompt: its system prompt and tools
        system = session.instructions or self.cfg.llm.system_prompt
        try:
            tools = tool_request(session).tools
        except ProtocolError:  # the reply reports it
            tools = ()
        return await self.engines.llm.end_of_turn(self.conv.id, text, self.conv.history.messages(system), tools)

    def _do_mend(self, d: Mend) -> None:
        """The user went on after a committed turn: stop its reply, take both out of the history (the
        client is told: ``conversation.item.deleted``), and give this utterance's turn its audio first."""
        previous = self._audio_of
        conv = self.conv
        if previous is None or not previous[0].committed or previous[0] not in (conv.turns.current, conv.last_turn):
            return  # another turn came between (a text message, a client commit)
        turn, audio = previous
        self.conv.interrupt("turn_detected")
        for item, shown in ((turn.user_item_id, True), (turn.item_id, turn.response_started)):
            if item is not None and (self.conv.history.remove(item) or shown):
                self._send(ev.ConversationItemDeleted(item_id=item))
        self._mended = audio

    def _do_transcribe(self, d: Transcribe) -> None:
        audio = self._judged_audio()
        if audio is not None and self._taking is not None:
            self._side_task(self._transcribe_burst(audio, self._taking, d.utterance, self._pauses))

    async def _transcribe_burst(self, audio: np.ndarray, taking: TurnTaking, utterance: int, pauses: int) -> None:
        """Words of speech over the paused reply (a cough has none)."""
        language = self._language()
        try:
            result = await self.engines.asr.transcribe(audio, language, priority=URGENT, prompt=self._prompt())
            text = result.text.strip()
        except VoxloopError:
            text = "?"  # unknown words: an interruption (the reply is cancelled, as without pausing)
        if pauses != self._pauses:
            return  # the speech went on after the pause it transcribed; a later pause asked again
        if self._taking is taking:
            self._perform(taking.transcribed(utterance, text))

    def _side_task(self, coro: Awaitable[None]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        task.add_done_callback(self.conv.task_done)

    def _do_barge_in(self, d: BargeIn) -> None:
        paused = self.conv.reply_turn()
        if paused is not None and paused.paused_at is not None:  # the client holds its audio: drop it
            self._send(ev.XOutputAudioBufferCleared(response_id=paused.response_id, item_id=paused.item_id,
                                                    audio_end_ms=round(paused.heard_ms())))
        self.conv.interrupt("turn_detected")

    def _do_pause(self, d: PauseReply) -> None:
        turn = self.conv.reply_turn()
        if turn is not None:
            heard = turn.pause_playback()
            self._send(ev.XOutputAudioBufferPaused(response_id=turn.response_id, item_id=turn.item_id,
                                                   audio_end_ms=round(heard)))

    def _do_resume(self, d: ResumeReply) -> None:
        turn = self.conv.reply_turn()
        if turn is not None and turn.paused_at is not None:
            turn.resume_playback()
            self._send(ev.XOutputAudioBufferResumed(response_id=turn.response_id, item_id=turn.item_id))

    def _reply_stopped(self) -> None:
        if self._taking is not None:
            self._taking.reply_ended()

    def _check_idle(self) -> None:
        """``turn_detection.idle_timeout_ms``: no speech for that long (stream time) after the last
        response stopped playing: ``input_audio_buffer.timeout_triggered`` and a response."""
        td = self._settings().audio.input.turn_detection
        vad, last = self._vad, self.conv.last_turn
        if (td is None or td.idle_timeout_ms is None or vad is None or vad.in_speech
                or self.conv.turns.running is not None or last is None or not last.response_started or self.conv.audible()):
            self._idle_from_ms = None
            return
        if self._idle_from_ms is None:
            self._idle_from_ms = vad.stream_ms
        elif vad.stream_ms - self._idle_from_ms >= td.idle_timeout_ms:
            item = new_id("item")
            self._send(ev.InputAudioBufferTimeoutTriggered(
                audio_start_ms=round(self._idle_from_ms), audio_end_ms=round(vad.stream_ms), item_id=item))
            self.conv.silence_reply(item, vad.stream_ms - self._idle_from_ms, self._mode)
            self._idle_from_ms = None

    # ------------------------------------------------------------------ partial transcripts
    def _maybe_partial(self) -> None:
        vad = self._vad
        interval = self.cfg.asr.partial_interval_ms
        if (interval <= 0 or self._settings().audio.input.transcription is None or vad is None or not vad.in_speech or vad.stream_ms < self._next_partial_ms
                or self._partial_task is not None or not self.engines.asr.idle()):
            return  # partials are opportunistic: never queue behind real work
        if self._speculative_turn() is not None:
            # A pause: the speculative turn transcribes this speech already, and its LLM and voice
            # need the cores now (a 2.5 s wait ran 6 partials: tests/test_turn_words_ws.py).
            return
        audio = vad.utterance_so_far()
        if audio is None:
            return
        self._next_partial_ms = vad.stream_ms + interval
        self._partial_task = asyncio.create_task(self._partial(audio, self._utterance, self._user_item))

    async def _partial(self, audio: np.ndarray, utterance: int, item: str | None) -> None:
        try:
            language = self._language()
            result = await self.engines.asr.transcribe(audio, language, priority=PARTIAL, prompt=self._prompt())
            text = result.text.strip()
            if utterance == self._utterance and item and text.startswith(self._partial_text) and text != self._partial_text:
                delta = text[len(self._partial_text):]
                self._partial_text = text
                self._send(ev.InputAudioTranscriptionDelta(item_id=item, delta=delta))
        except VoxloopError:
            pass  # a partial is a courtesy; the final transcript reports real errors
        finally:
            self._partial_task = None

    def _prompt(self) -> str | None:
        """The session's ``transcription.prompt`` (whisper's initial prompt), if any."""
        transcription = self._settings().audio.input.transcription
        return transcription.prompt if transcription is not None and transcription.prompt else None

    def _language(self) -> str | None:
        """The session's transcription language, else the server's ``asr.language``."""
        transcription = self._settings().audio.input.transcription
        if transcription is not None and transcription.language:
            return transcription.language
        return self.cfg.asr.language

    # ------------------------------------------------------------------ voice turns
    def _start_voice_turn(self, audio: np.ndarray, committed: bool, speech_end_at: float | None = None,
                          vad_end_at: float | None = None, queued: tuple[int, str | None] | None = None) -> None:
        """A voice turn for ``audio`` (of the current utterance and user item, or of ``queued``'s)."""
        utterance, item = queued or (self._utterance, self._user_item)
        if self._mended is not None and queued is None:  # this utterance goes on with a mended turn
            audio = np.concatenate((self._mended, audio))
        td = self._settings().audio.input.turn_detection
        interrupts = td is None or td.interrupt_response
        current = self.conv.turns.running
        if not interrupts and current is not None and current.committed:
            # interrupt_response false: the reply in progress is made to its end, then this turn
            # starts (turns of later speech queue behind it); nothing is speculated meanwhile.
            if committed:
                self._side_task(self._start_after(current, audio, speech_end_at, vad_end_at, (utterance, item)))
            return
        # A speculative turn of older speech is always dropped; a reply is stopped (and a finished
        # one still playing cut in history) only when speech may interrupt it.
        self.conv.interrupt("turn_detected", by_voice=interrupts)
        turn = self.conv.new_turn(self._mode, committed, utterance)
        if self._speech_start_at is not None and self._vad is not None and queued is None:
            turn.trace.mark("speech_start", self._speech_start_at)
        if speech_end_at is not None:
            turn.trace.mark("speech_end", speech_end_at)
        if vad_end_at is not None:
            turn.trace.mark("vad_end", vad_end_at)
        turn.user_item_id = item or new_id("item")
        turn.transcribe_only = (td is not None and not td.create_response) or self._settings().type == "transcription"
        turn.trace.info["audio_ms"] = round(1000 * len(audio) / ASR_RATE)
        if self._mended is not None and queued is None:
            turn.trace.info["mended"] = True
        self._audio_of = (turn, audio)
        self.conv.spawn(turn, self._voice_turn(turn, audio))

    async def _start_after(self, reply: Turn, audio: np.ndarray, speech_end_at: float | None,
                           vad_end_at: float | None, queued: tuple[int, str | None]) -> None:
        await reply.finished.wait()
        self._start_voice_turn(audio, committed=True, speech_end_at=speech_end_at, vad_end_at=vad_end_at,
                               queued=queued)

    async def _voice_turn(self, turn: Turn, audio: np.ndarray) -> None:
        conv = self.conv
        item = turn.user_item_id or new_id("item")
        previous = turn.previous_item_id = conv.history.last_item_id()
        conv.turns.emit(turn, ev.ConversationItemAdded(item=conv.user_message(item, "in_progress"),
                                                       previous_item_id=previous))
        try:
            turn.trace.mark("asr_start")
            language = self._language()
            priority = NORMAL if turn.committed else BACKGROUND
            result = await self.engines.asr.transcribe(audio, language, priority=priority, cancel=turn.cancel,
                                                       prompt=self._prompt())
            turn.trace.mark("asr_final")
            text = result.text.strip()
            turn.user_text = text
            # transcription null: no transcript events and none in the item (the LLM still reads the words)
            shown = text if self._settings().audio.input.transcription is not None else None
            if shown is not None:
                conv.turns.emit(turn, ev.InputAudioTranscriptionCompleted(
                    item_id=item, transcript=text, usage=ev.TranscriptionUsage(seconds=len(audio) / ASR_RATE)))
            conv.turns.emit(turn, ev.ConversationItemDone(item=conv.user_message(item, "completed", shown),
                                                          previous_item_id=previous))
            if turn.committed:
                conv.add_user_message(turn)
            else:  # semantic_vad: the last words may end the turn now (Commit adds the user message)
                self._heard(turn, text, result.language)
            if not text or turn.transcribe_only:
                turn.reply_asked.set()  # no reply: nothing to wait for
                await turn.released.wait()  # committed: a transcript is in the history now
                conv.finish(turn, "transcribed" if text else "empty_transcript")
                return
            await conv.reply(turn, pending_user=None if turn.committed else text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, the session goes on
            conv.fail(turn, exc)


async def _first(events: tuple[asyncio.Event, ...], future: asyncio.Future | None = None) -> None:
    """Return once one of ``events`` is set (or ``future`` is done)."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waits, *([future] if future is not None else [])], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


_DECISIONS: dict[type, Callable[[VoiceInput, Any], None]] = {
    StartTurn: VoiceInput._do_start,
    Commit: VoiceInput._do_commit,
    DropTurn: VoiceInput._do_drop,
    Discard: VoiceInput._do_discard,
    Score: VoiceInput._do_score,
    ScoreWords: VoiceInput._do_score_words,
    Mend: VoiceInput._do_mend,
    Transcribe: VoiceInput._do_transcribe,
    BargeIn: VoiceInput._do_barge_in,
    PauseReply: VoiceInput._do_pause,
    ResumeReply: VoiceInput._do_resume,
}
