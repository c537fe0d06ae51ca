"""The turn-taking state machine, table-driven: inputs in, decisions out; no event loop, no clock."""

from __future__ import annotations

import pytest

from pipeline.turn_taking import (
    EAGERNESS,
    BargeIn,
    Commit,
    Discard,
    DropTurn,
    Mend,
    PauseReply,
    Policy,
    ResumeReply,
    Score,
    ScoreWords,
    StartTurn,
    Transcribe,
    TurnTaking,
    is_backchannel,
    is_noise,
    words_cap,
)

SERVER = Policy(silence_ms=500, barge_in_min_ms=250)
SEMANTIC = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                               pause_on_speech=True, pause_max_speech_ms=1500)
SEMANTIC_NO_PAUSE = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                                        pause_on_speech=False, pause_max_speech_ms=1500)
# turn.asr_pause_ms < turn.pause_ms: the VAD pauses early (ASR), the score waits for 180 ms of silence.
EARLY_ASR = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                                pause_on_speech=True, pause_max_speech_ms=1500, score_pause_ms=180)
# turn.score_early: the score is asked at the VAD's pause too, and acted on at score_pause_ms.
EARLY_SCORE = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                                  pause_on_speech=True, pause_max_speech_ms=1500, score_pause_ms=180,
                                  score_early=True)
# The LLM scores the words too (turn.score_words): threshold 0.03, the longer stop 1200 ms.
WORDS = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                            pause_on_speech=True, pause_max_speech_ms=1500, words_threshold=0.03, long_stop_ms=1200)
WORDS_EARLY = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                                  pause_on_speech=True, pause_max_speech_ms=1500, score_pause_ms=180,
                                  score_early=True, words_threshold=0.03, long_stop_ms=1200)
# turn.mend_ms: speech within 1500 ms of a committed turn's end continues it.
SERVER_MEND = Policy(silence_ms=500, barge_in_min_ms=250, mend_ms=1500)
SEMANTIC_MEND = Policy.semantic_vad("medium", silence_ms=500, barge_in_min_ms=250, max_silence_ms=2000,
                                    pause_on_speech=True, pause_max_speech_ms=1500, mend_ms=1500)
EGG = "How long does it take"

# Each step: (method, args..., expected decisions). "audible" is the assistant's reply playing.
CASES = {
    "server_vad: speculate at the pause, commit at the VAD's end": (SERVER, [
        ("speech_started", 1000, False, []),
        ("tick", 1500, False, []),
        ("paused", 2000, False, [StartTurn(1, speculative=True)]),
        ("tick", 2600, False, []),  # the VAD decides the end, not the clock
        ("speech_ended", 2000, False, False, [Commit(1)]),
    ]),
    "server_vad: speech resumes after the pause: the speculation is dropped": (SERVER, [
        ("speech_started", 0, False, []),
        ("paused", 800, False, [StartTurn(1, speculative=True)]),
        ("resumed", 1100, [DropTurn(1)]),
        ("paused", 1900, False, [StartTurn(1, speculative=True)]),
        ("speech_ended", 1900, False, False, [Commit(1)]),
    ]),
    "server_vad: speech over the reply for barge_in_min_ms interrupts, then is a turn": (SERVER, [
        ("speech_started", 0, True, []),
        ("tick", 200, True, []),
        ("tick", 260, True, [BargeIn()]),
        ("tick", 400, True, []),  # once
        ("paused", 900, False, [StartTurn(1, speculative=True)]),
        ("speech_ended", 900, False, False, [Commit(1)]),
    ]),
    "server_vad: a cough over the reply is no turn and no barge-in": (SERVER, [
        ("speech_started", 0, True, []),
        ("paused", 150, True, []),  # no speculation while the reply plays
        ("speech_ended", 150, False, True, [Discard(1)]),
        ("tick", 1000, True, []),
    ]),
    "semantic: a complete score commits at the pause": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("tick", 1300, False, []),
        ("scored", 1, 0.95, 1390, False, []),  # complete by the model: the words are still unknown
        ("heard", 1, "What's the capital of France?", "en", 1410, False, [Commit(1, end_utterance=True)]),
        ("speech_ended", 3200, False, False, []),  # the VAD was reset; a late end changes nothing
    ]),
    "semantic: words known before the score: a complete score commits at once": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "Please turn on the lights.", "en", 1350, False, []),
        ("scored", 1, 0.95, 1390, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: complete by the model, the words never come: commit at max_silence_ms": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1150, False, []),
        ("tick", 2990, False, []),  # the reply cannot start without them either
        ("tick", 3000, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: an article last: the words overrule a complete score, wait the longest": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.98, 1150, False, []),
        ("heard", 1, "Tell me a joke about the", "en", 1250, False, []),
        ("tick", 2990, False, []),  # max_silence_ms after the speech ended
        ("tick", 3000, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: a preposition last: wait half way to the longest, then commit": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.98, 1150, False, []),
        ("heard", 1, "I'd like to book a table for", "en", 1300, False, []),
        ("tick", 2240, False, []),  # 500 + 1500 / 2 after the speech ended
        ("tick", 2250, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: a question ending in a preposition is complete": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "What is this button for?", "en", 1100, False, []),
        ("scored", 1, 0.95, 1150, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: server_vad ignores the words": (SERVER, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),
        ("heard", 1, "Tell me a joke about", "en", 1100, False, []),
        ("speech_ended", 1000, False, False, [Commit(1)]),
    ]),
    "semantic: a score just under complete waits for the silence stop": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.8999, 1250, False, []),
        ("tick", 1490, False, []),
        ("tick", 1501, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: an unsure score waits longer, in proportion": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.6, 1250, False, []),  # half way: 500 + 1500 / 2
        ("tick", 2240, False, []),
        ("tick", 2250, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: an incomplete score waits through a long pause; speech goes on": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.1, 1250, False, []),
        ("tick", 1600, False, []),  # past the silence stop: still waiting
        ("resumed", 1700, [DropTurn(1)]),
        ("paused", 2500, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "I think so. Stale words of the dropped pause?", "en", 2600, False, []),
        ("scored", 1, 0.97, 2700, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: incomplete for ever ends at max_silence_ms": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.05, 1200, False, []),
        ("tick", 2990, False, []),
        ("tick", 3000, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: a score that arrives after speech resumed is stale": (SEMANTIC, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("resumed", 1100, [DropTurn(1)]),
        ("scored", 1, 0.99, 1150, False, []),
    ]),
    "semantic: a burst over the reply: its empty transcript resumes the reply": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("tick", 300, True, []),
        ("paused", 350, True, [Transcribe(1)]),
        ("transcribed", 1, "", [ResumeReply(), Discard(1, end_utterance=True)]),
        ("speech_ended", 850, False, True, []),
    ]),
    "semantic: a short burst ends before its words: resumed at once": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 120, True, [Transcribe(1)]),
        ("tick", 620, True, [ResumeReply(), Discard(1, end_utterance=True)]),
        ("transcribed", 1, "", []),
    ]),
    "semantic: 'mm-hm' over the reply resumes it": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 400, True, [Transcribe(1)]),
        ("transcribed", 1, "Mm-hmm.", [ResumeReply(), Discard(1, end_utterance=True)]),
    ]),
    "semantic: words over the reply cancel it and take the turn": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 700, True, [Transcribe(1)]),
        ("transcribed", 1, "Wait, stop.", [BargeIn(), StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1000, False, []),
        ("heard", 1, "Wait, stop.", "en", 1010, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: words known only after the VAD ended the burst": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 700, True, [Transcribe(1)]),
        ("tick", 1200, True, []),  # the silence stop: the words decide, still unknown
        ("speech_ended", 700, False, True, []),
        ("transcribed", 1, "No, the other one", [BargeIn(), Commit(1)]),
    ]),
    "semantic: long speech over the paused reply cancels it without waiting for words": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("tick", 1400, True, []),
        ("tick", 1500, True, [BargeIn()]),
        ("paused", 2100, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "No no, I meant the other one.", "en", 2250, False, []),
        ("scored", 1, 0.9, 2300, False, [Commit(1, end_utterance=True)]),
    ]),
    "semantic: new speech while the words of a burst are pending: an interruption": (SEMANTIC, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 400, True, [Transcribe(1)]),
        ("speech_ended", 400, False, True, []),
        ("speech_started", 1300, False, [BargeIn(), Commit(1)]),
        ("transcribed", 1, "", []),
    ]),
    "interrupt_response false: speech over the reply neither cuts nor pauses it, then is a turn": (
        Policy(silence_ms=500, barge_in_min_ms=250, interrupt=False), [
            ("speech_started", 0, True, []),
            ("tick", 900, True, []),
            ("paused", 1000, True, []),
            ("speech_ended", 1000, False, True, [Commit(1)]),
        ]),
    "interrupt_response false, semantic: no pause of the reply either; a cough is no turn": (
        Policy.semantic_vad("medium", 500, 250, 2000, True, 1500, interrupt=False), [
            ("speech_started", 0, True, []),
            ("paused", 150, True, []),
            ("speech_ended", 150, False, True, [Discard(1)]),
        ]),
    "semantic without pause_on_speech: barge-in as server_vad": (SEMANTIC_NO_PAUSE, [
        ("speech_started", 0, True, []),
        ("tick", 250, True, [BargeIn()]),
    ]),
    "early ASR: the turn starts at the VAD's pause, the score at score_pause_ms": (EARLY_ASR, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),  # detected at 1060
        ("tick", 1179, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1170, False, []),  # before the score: kept
        ("tick", 1180, False, [Score(1)]),
        ("tick", 1200, False, []),  # once
        ("scored", 1, 0.95, 1250, False, [Commit(1, end_utterance=True)]),
    ]),
    "early ASR: the words after the score commit, as without it": (EARLY_ASR, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),
        ("tick", 1180, False, [Score(1)]),
        ("scored", 1, 0.95, 1250, False, []),
        ("heard", 1, "Please turn on the lights.", "en", 1300, False, [Commit(1, end_utterance=True)]),
    ]),
    "early ASR: speech resumes before score_pause_ms: dropped, never scored": (EARLY_ASR, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),
        ("resumed", 1090, [DropTurn(1)]),
        ("tick", 1200, False, []),  # no score of the stale pause
        ("heard", 1, "Tell me a", "en", 1250, False, []),  # its transcript is stale too
        ("paused", 2000, False, [StartTurn(1, speculative=True)]),
        ("tick", 2180, False, [Score(1)]),
        ("scored", 1, 0.2, 2250, False, []),
        ("tick", 3990, False, []),  # an unsure score waits from the speech's end, as before
        ("tick", 4000, False, [Commit(1, end_utterance=True)]),
    ]),
    "early ASR: a burst over the reply is transcribed at score_pause_ms": (EARLY_ASR, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 400, True, []),
        ("tick", 579, True, []),
        ("tick", 580, True, [Transcribe(1)]),
        ("transcribed", 1, "", [ResumeReply(), Discard(1, end_utterance=True)]),
    ]),
    "early ASR: speech over the playing reply (no pause) starts no turn": (
        Policy.semantic_vad("medium", 500, 250, 2000, True, 1500, interrupt=False, score_pause_ms=180), [
            ("speech_started", 0, True, []),
            ("paused", 150, True, []),
            ("tick", 400, True, []),
            ("speech_ended", 150, False, True, [Discard(1)]),
        ]),
    "early score: complete before score_pause_ms, it commits exactly then": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),  # detected at 1060
        ("heard", 1, "What's the capital of France?", "en", 1090, False, []),
        ("scored", 1, 0.95, 1110, False, []),  # kept: the silence is not 180 ms yet
        ("tick", 1179, False, []),
        ("tick", 1180, False, [Commit(1, end_utterance=True)]),  # no second score
        ("tick", 1200, False, []),  # once
    ]),
    "early score: complete at exactly the threshold commits": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.9, 1100, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1120, False, []),
        ("tick", 1180, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: complete, the words after score_pause_ms commit": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1110, False, []),
        ("tick", 1180, False, []),  # complete by the model; the words may still say otherwise
        ("heard", 1, "Please turn on the lights.", "en", 1250, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: incomplete, dropped: a second score at score_pause_ms sets the wait": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.6, 1100, False, []),
        ("heard", 1, "Could you remind me to call my mother", "en", 1120, False, []),
        ("tick", 1179, False, []),
        ("tick", 1180, False, [Score(1)]),  # asked again, as with score_early off
        ("tick", 1229, False, []),  # no wait set by the early 0.6 (it would end at 2250)
        ("scored", 1, 0.75, 1230, False, []),  # waits 500 + 1500 x (0.9 - 0.75) / 0.6 from the speech's end
        ("tick", 1874, False, []),
        ("tick", 1875, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: incomplete, dropped: a complete second score commits on arrival": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "What's the capital of France?", "en", 1090, False, []),
        ("scored", 1, 0.89, 1100, False, []),
        ("tick", 1180, False, [Score(1)]),
        ("scored", 1, 0.95, 1225, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: complete, but the words say the sentence goes on: a second score sets the wait": (
        EARLY_SCORE, [
            ("speech_started", 0, False, []),
            ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
            ("scored", 1, 0.98, 1100, False, []),
            ("heard", 1, "Tell me a joke about", "en", 1120, False, []),
            ("tick", 1180, False, [Score(1)]),  # capped under complete: not used
            ("scored", 1, 0.4, 1230, False, []),  # 0.4 (under the words' cap 0.6): 500 + 1500 x 0.5 / 0.6
            ("tick", 2749, False, []),
            ("tick", 2750, False, [Commit(1, end_utterance=True)]),
        ]),
    "early score: complete, the words after score_pause_ms cap it: a second score then": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.98, 1100, False, []),
        ("tick", 1180, False, []),  # waiting for the words
        ("heard", 1, "Tell me a joke about", "en", 1250, False, [Score(1)]),
        ("scored", 1, 0.98, 1300, False, []),  # capped half way between incomplete and complete: 1250 ms
        ("tick", 2249, False, []),
        ("tick", 2250, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: complete, arriving after score_pause_ms: it commits on arrival": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "What's the capital of France?", "en", 1090, False, []),
        ("tick", 1180, False, []),  # not asked again: the early score is awaited
        ("tick", 1200, False, []),
        ("scored", 1, 0.95, 1230, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: complete, arriving after score_pause_ms before the words: they commit": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("tick", 1180, False, []),
        ("scored", 1, 0.95, 1230, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1260, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: incomplete, arriving after score_pause_ms: a second score then": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "Could you remind me to call my mother", "en", 1090, False, []),
        ("tick", 1180, False, []),
        ("scored", 1, 0.6, 1230, False, [Score(1)]),
        ("scored", 1, 0.3, 1270, False, []),  # incomplete: the longest wait, 2000 ms
        ("tick", 2250, False, []),  # the early 0.6 set no wait (it would end here)
        ("tick", 2999, False, []),
        ("tick", 3000, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: a second score that never comes: the turn ends at max_silence_ms": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.5, 1100, False, []),
        ("tick", 1180, False, [Score(1)]),
        ("tick", 2999, False, []),
        ("tick", 3000, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: speech resuming before score_pause_ms drops it": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "I'd like to book a table for", "en", 1080, False, []),
        ("scored", 1, 0.95, 1100, False, []),
        ("resumed", 1150, [DropTurn(1)]),
        ("tick", 1180, False, []),  # the kept score went with the speculation
        ("scored", 1, 0.95, 1190, False, []),  # a score of the stale pause arriving late
        ("paused", 2000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "I'd like to book a table for four people tonight.", "en", 2090, False, []),
        ("tick", 2180, False, []),  # no score of this pause yet: no commit on the old one
        ("scored", 1, 0.96, 2220, False, [Commit(1, end_utterance=True)]),
    ]),
    "early score: speech resuming after the second score was asked drops it": (EARLY_SCORE, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.5, 1100, False, []),
        ("tick", 1180, False, [Score(1)]),
        ("resumed", 1200, [DropTurn(1)]),
        ("scored", 1, 0.95, 1230, False, []),
        ("tick", 3000, False, []),
    ]),
    "early score: speech over the paused reply is still transcribed at score_pause_ms": (EARLY_SCORE, [
        ("speech_started", 0, True, [PauseReply()]),
        ("paused", 400, True, []),
        ("tick", 579, True, []),
        ("tick", 580, True, [Transcribe(1)]),
        ("transcribed", 1, "", [ResumeReply(), Discard(1, end_utterance=True)]),
    ]),
    "early score off (score_early=False): the score is asked at score_pause_ms, as before": (
        Policy.semantic_vad("medium", 500, 250, 2000, True, 1500, score_pause_ms=180, score_early=False), [
            ("speech_started", 0, False, []),
            ("paused", 1000, False, [StartTurn(1, speculative=True)]),
            ("heard", 1, "What's the capital of France?", "en", 1090, False, []),
            ("tick", 1179, False, []),
            ("tick", 1180, False, [Score(1)]),
            ("scored", 1, 0.95, 1230, False, [Commit(1, end_utterance=True)]),
        ]),
    "early score without score_pause_ms: scored and decided at the VAD's pause": (
        Policy.semantic_vad("medium", 500, 250, 2000, True, 1500, score_early=True), [
            ("speech_started", 0, False, []),
            ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1)]),
            ("heard", 1, "What's the capital of France?", "en", 1090, False, []),
            ("scored", 1, 0.95, 1100, False, [Commit(1, end_utterance=True)]),
        ]),
    "words: sound and words complete: the turn ends at the short pause": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1390, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1410, False,
         [ScoreWords(1, "What's the capital of France?")]),
        ("words_scored", 1, 0.9, 1450, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: complete by the sound, not by the words: wait for the longer stop": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, EGG, "en", 1380, False, [ScoreWords(1, EGG)]),
        ("scored", 1, 0.97, 1390, False, []),  # the words' score is still out
        ("words_scored", 1, 0.007, 1450, False, []),
        ("tick", 2399, False, []),
        ("tick", 2400, False, [Commit(1, end_utterance=True)]),  # 1200 ms after the speech
    ]),
    "words: the sentence goes on within the longer stop: one turn": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.97, 1390, False, []),
        ("heard", 1, EGG, "en", 1400, False, [ScoreWords(1, EGG)]),
        ("words_scored", 1, 0.007, 1450, False, []),
        ("resumed", 2100, [DropTurn(1)]),  # a 900 ms pause
        ("words_scored", 1, 0.9, 2150, False, []),  # late: stale
        ("paused", 3000, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, f"{EGG} to boil an egg?", "en", 3200, False, [ScoreWords(1, f"{EGG} to boil an egg?")]),
        ("scored", 1, 0.95, 3210, False, []),
        ("words_scored", 1, 0.3, 3250, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: finished words cap the doubting sound's wait at the longer stop": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.1, 1300, False, []),  # the sound alone: wait 2000 ms
        ("heard", 1, "How far away is the moon?", "en", 1400, False, [ScoreWords(1, "How far away is the moon?")]),
        ("words_scored", 1, 0.6, 1450, False, []),
        ("tick", 2400, False, [Commit(1, end_utterance=True)]),  # 1200, not 2000
    ]),
    "words: finished words the sound doubts, not sure of it: the longer stop, not the sound's wait": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.81, 1300, False, []),  # the sound alone: 500 + 1500 * 0.09 / 0.6 = 725 ms
        ("heard", 1, "Book me a table.", "en", 1400, False, [ScoreWords(1, "Book me a table.")]),
        ("words_scored", 1, 0.11, 1450, False, []),
        ("tick", 2100, False, []),  # a 900 ms pause: "... at an Italian place"
        ("tick", 2399, False, []),
        ("tick", 2400, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: sure words the sound doubts: the sound's wait": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.81, 1300, False, []),
        ("heard", 1, "Where do penguins live?", "en", 1400, False, [ScoreWords(1, "Where do penguins live?")]),
        ("words_scored", 1, 0.6, 1450, False, []),
        ("tick", 1920, False, []),
        ("tick", 1925, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: unfinished words make a doubting sound wait at least the longer stop": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.85, 1300, False, []),  # the sound alone: ~600 ms
        ("heard", 1, "Set a timer for", "en", 1400, False, [ScoreWords(1, "Set a timer for")]),
        ("words_scored", 1, 0.0001, 1450, False, []),
        ("tick", 2300, False, []),
        ("tick", 2400, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: a doubting sound does not end the turn while the words' score is out": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.85, 1300, False, []),  # the sound alone: ~620 ms
        ("heard", 1, "I think that", "en", 1400, False, [ScoreWords(1, "I think that")]),
        ("tick", 2000, False, []),  # past the sound's wait: the words may still say it goes on
        ("words_scored", 1, 0.001, 2050, False, []),
        ("tick", 2400, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: finished words that come late end a doubting sound's wait at once": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.85, 1300, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1400, False,
         [ScoreWords(1, "What's the capital of France?")]),
        ("tick", 2000, False, []),
        ("words_scored", 1, 0.9, 2050, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: no score from the model: the sound decides": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1390, False, []),
        ("heard", 1, EGG, "en", 1410, False, [ScoreWords(1, EGG)]),
        ("words_scored", 1, None, 1450, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: a preposition last no longer caps the score; the words decide": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1390, False, []),
        ("heard", 1, "What is this for", "en", 1410, False, [ScoreWords(1, "What is this for")]),
        ("words_scored", 1, 0.4, 1450, False, [Commit(1, end_utterance=True)]),
    ]),
    "words: a greeting alone still waits for the silence stop": (WORDS, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1390, False, []),
        ("heard", 1, "Good morning.", "en", 1410, False, [ScoreWords(1, "Good morning.")]),
        ("words_scored", 1, 0.6, 1450, False, []),  # sure of it (under words_sure: the longer stop)
        ("tick", 1690, False, []),
        ("tick", 1701, False, [Commit(1, end_utterance=True)]),
    ]),
    "words, early score: complete by the sound, not by the words: the longer stop, no second score": (WORDS_EARLY, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1, early=True)]),
        ("scored", 1, 0.95, 1050, False, []),
        ("heard", 1, EGG, "en", 1100, False, [ScoreWords(1, EGG)]),
        ("tick", 1180, False, []),  # the words' score is still out
        ("words_scored", 1, 0.001, 1200, False, []),
        ("tick", 2199, False, []),
        ("tick", 2200, False, [Commit(1, end_utterance=True)]),
    ]),
    "words, early score: both complete: the turn ends at score_pause_ms": (WORDS_EARLY, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True), Score(1, early=True)]),
        ("scored", 1, 0.95, 1050, False, []),
        ("heard", 1, "Yes.", "en", 1100, False, [ScoreWords(1, "Yes.")]),
        ("words_scored", 1, 0.1, 1150, False, []),
        ("tick", 1180, False, [Commit(1, end_utterance=True)]),
    ]),
    "mend: speech soon after a commit, over the reply, continues the turn": (SERVER_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),
        ("speech_ended", 1000, False, False, [Commit(1)]),
        ("speech_started", 2400, True, []),  # 1400 ms after the first part's end
        ("tick", 2660, True, [BargeIn()]),
        ("paused", 3300, False, [Mend(1), StartTurn(2, speculative=True)]),
        ("resumed", 3400, [DropTurn(2)]),
        ("paused", 3800, False, [StartTurn(2, speculative=True)]),  # once
        ("speech_ended", 3800, False, False, [Commit(2)]),
    ]),
    "mend: speech later than mend_ms after a commit is a turn of its own": (SERVER_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 1000, False, [StartTurn(1, speculative=True)]),
        ("speech_ended", 1000, False, False, [Commit(1)]),
        ("speech_started", 2600, False, []),
        ("paused", 3300, False, [StartTurn(2, speculative=True)]),
    ]),
    "mend: words over the paused reply right after a commit continue the turn": (SEMANTIC_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1300, False, []),
        ("heard", 1, EGG, "en", 1350, False, [Commit(1, end_utterance=True)]),
        ("speech_started", 2700, True, [PauseReply()]),  # the 1.5 s pause
        ("paused", 3600, True, [Transcribe(2)]),
        ("transcribed", 2, "to boil an egg?", [BargeIn(), Mend(1), StartTurn(2, speculative=True), Score(2)]),
    ]),
    "mend: an acknowledgement within a pause of the commit goes on with the turn": (SEMANTIC_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 600, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "No.", "en", 700, False, []),
        ("scored", 1, 0.93, 720, False, [Commit(1, end_utterance=True)]),  # the reply starts at once
        ("speech_started", 900, True, [PauseReply()]),  # "No, [300 ms] thanks."
        ("paused", 1400, True, [Transcribe(2)]),
        ("transcribed", 2, "thanks", [BargeIn(), Mend(1), StartTurn(2, speculative=True), Score(2)]),
    ]),
    "mend: an acknowledgement later than a pause inside a sentence is a backchannel": (SEMANTIC_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 600, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "Tell me about the moon.", "en", 700, False, []),
        ("scored", 1, 0.93, 720, False, [Commit(1, end_utterance=True)]),
        ("speech_started", 1801, True, [PauseReply()]),  # 1201 ms after: the reply was heard
        ("paused", 2200, True, [Transcribe(2)]),
        ("transcribed", 2, "Okay.", [ResumeReply(), Discard(2, end_utterance=True)]),
    ]),
    "mend: a sound without words right after a commit resumes the reply": (SEMANTIC_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 600, False, [StartTurn(1, speculative=True), Score(1)]),
        ("heard", 1, "No.", "en", 700, False, []),
        ("scored", 1, 0.93, 720, False, [Commit(1, end_utterance=True)]),
        ("speech_started", 900, True, [PauseReply()]),
        ("paused", 1300, True, [Transcribe(2)]),
        ("transcribed", 2, "Mm-hmm.", [ResumeReply(), Discard(2, end_utterance=True)]),
    ]),
    "mend: a cough right after a commit resumes the reply and mends nothing": (SEMANTIC_MEND, [
        ("speech_started", 0, False, []),
        ("paused", 1200, False, [StartTurn(1, speculative=True), Score(1)]),
        ("scored", 1, 0.95, 1300, False, []),
        ("heard", 1, "What's the capital of France?", "en", 1350, False, [Commit(1, end_utterance=True)]),
        ("speech_started", 2000, True, [PauseReply()]),
        ("speech_ended", 2150, False, True, [ResumeReply(), Discard(2)]),
    ]),
    "early ASR: server_vad ignores score_pause_ms": (
        Policy(silence_ms=500, barge_in_min_ms=250, score_pause_ms=180), [
            ("speech_started", 0, False, []),
            ("paused", 1000, False, [StartTurn(1, speculative=True)]),
            ("tick", 1300, False, []),
            ("speech_ended", 1000, False, False, [Commit(1)]),
        ]),
}


@pytest.mark.parametrize("name", CASES)
def test_turn_taking(name):
    policy, steps = CASES[name]
    tt = TurnTaking(policy)
    for i, (method, *args, expected) in enumerate(steps):
        got = getattr(tt, method)(*args)
        assert got == expected, f"step {i} {method}{tuple(args)}"


def test_reply_ended_forgets_a_pause():
    tt = TurnTaking(SEMANTIC)
    assert tt.speech_started(0, audible=True) == [PauseReply()]
    tt.reply_ended()  # e.g. the client cancelled the response
    assert not tt.reply_paused
    assert tt.paused(700, audible=False) == [StartTurn(1, speculative=True), Score(1)]


@pytest.mark.parametrize(("text", "backchannel"), [
    ("", True), ("Mm-hmm.", True), ("Uh-huh", True), ("[coughing]", True), ("(coughs) you", True),
    ("Okay.", True), ("Yeah, okay.", True), ("Wait.", False), ("Stop talking", False), ("What?", False),
])
def test_backchannels(text, backchannel):
    assert is_backchannel(text) is backchannel


@pytest.mark.parametrize(("text", "noise"), [
    ("", True), ("Mm-hmm.", True), ("[coughing] uh", True), ("you", True),
    ("Thanks.", False), ("Okay.", False), ("Yes", False), ("Wait.", False),
])
def test_noise_has_no_words(text, noise):
    assert is_noise(text) is noise


def test_wait_grows_from_the_silence_stop_to_the_maximum():
    assert SEMANTIC.wait_ms(0.9) == 500 and SEMANTIC.wait_ms(0.3) == SEMANTIC.wait_ms(0.0) == 2000
    assert 500 < SEMANTIC.wait_ms(0.7) < SEMANTIC.wait_ms(0.5) < 2000


def test_eagerness_orders_thresholds_and_waits():
    low, medium, high = (Policy.semantic_vad(e, 500, 250, 2000, True, 1500) for e in ("low", "medium", "high"))
    assert low.complete > medium.complete > high.complete
    assert low.max_silence_ms > medium.max_silence_ms > high.max_silence_ms >= 500
    assert EAGERNESS["auto"] == EAGERNESS["medium"]
    assert SERVER.vad_silence_ms == 500 and medium.vad_silence_ms == 2000


def test_a_paused_reply_is_heard_no_further_until_resumed():
    from pipeline.trace import TurnTrace
    from pipeline.turn import Turn

    turn = Turn(1, "resp_1", "item_1", TurnTrace(1, "s", "semantic_vad"), committed=True)
    turn.audio_sent_ms, turn.first_audio_at = 5000.0, 100.0  # no playback reports: wall-clock estimate
    assert turn.heard_ms(now=101.0) == 1000
    assert turn.pause_playback(now=101.0) == 1000
    assert turn.heard_ms(now=103.0) == 1000 and turn.still_audible(now=103.0)  # frozen while paused
    turn.resume_playback(now=103.0)
    assert turn.heard_ms(now=103.5) == 1500  # plays on from where it stopped


@pytest.mark.parametrize(("text", "language", "cap"), [
    ("Tell me a joke about", "en", 0.6),  # SEMANTIC ("medium"): half way between 0.3 and 0.9
    ("Tell me a joke about.", "en", 0.6),  # whisper's full stop does not end a dangling preposition
    ("What are you talking about?", "en", 1.0),
    ("I'd like to book a table for the", "en", 0.3),
    ("Bread, milk, and", "en", 0.3),
    ("I was thinking, um", None, 0.3),
    ("Let me see...", "en", 0.3),
    ("Let me see\u2026", "en", 0.3),
    ("The weather is nice today.", "en", 1.0),
    ("", "en", 1.0),
    ("Je voudrais une table pour", "fr", 1.0),  # English rules only
    ("Good morning.", "en", 0.9 - 1e-6),  # only a greeting: just under complete (the silence stop)
    ("Hello there", "en", 0.9 - 1e-6),
    ("Hi!", "en", 0.9 - 1e-6),
    ("Hello?", "en", 1.0),  # asking whether anyone listens: a turn of its own
    ("Hello there, can you hear me?", "en", 1.0),
    ("Good morning to you all.", "en", 1.0),
])
def test_words_cap(text, language, cap):
    assert words_cap(text, language, SEMANTIC) == pytest.approx(cap, abs=1e-9)


def test_a_greeting_alone_waits_for_the_silence_stop():
    """"Good morning." scored complete: no commit at the pause; the turn ends at the silence stop
    unless the user goes on (then the speculation is dropped and nothing was answered)."""
    t = TurnTaking(SEMANTIC)
    t.speech_started(0, False)
    t.paused(1000, False)
    assert t.scored(1, 0.99, 1150, False) == []  # waits for the words (the reply needs them too)
    assert t.heard(1, "Good morning.", "en", 1160, False) == []  # a greeting: not yet
    assert t.tick(1499, False) == []
    assert t.tick(1501, False) == [Commit(1, end_utterance=True)]  # the silence stop (500 ms)
    t2 = TurnTaking(SEMANTIC)
    t2.speech_started(0, False)
    t2.paused(1000, False)
    t2.scored(1, 0.99, 1150, False)
    t2.heard(1, "Good morning.", "en", 1160, False)
    assert t2.resumed(1300) == [DropTurn(1)]  # "… What is two plus two?": one turn


def test_an_early_score_is_marked_so_the_session_scores_the_pause_audio():
    """The score asked at the VAD's pause is ``early`` (scored on the audio that pause carried);
    the one asked again at ``score_pause_ms`` is not (the utterance with the longer silence)."""
    t = TurnTaking(EARLY_SCORE)
    t.speech_started(0, False)
    first = [d for d in t.paused(1000, False) if isinstance(d, Score)]
    assert len(first) == 1 and first[0].early
    t.scored(1, 0.6, 1100, False)
    again = [d for d in t.tick(1180, False) if isinstance(d, Score)]
    assert len(again) == 1 and not again[0].early
    t2 = TurnTaking(EARLY_ASR)  # without score_early: asked at score_pause_ms only, not early
    t2.speech_started(0, False)
    assert not [d for d in t2.paused(1000, False) if isinstance(d, Score)]
    assert [d.early for d in t2.tick(1180, False) if isinstance(d, Score)] == [False]
