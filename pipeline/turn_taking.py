"""Turn taking as one pure state machine: what the user's voice means for the conversation.

No asyncio, no I/O, no clock of its own. ``TurnTaking`` is fed what happened — VAD events,
end-of-turn scores, transcripts of speech over a paused reply, the passing of stream time —
and returns ``Decision`` objects; ``Session`` performs them (starts and commits turns, tells
the client, runs models). Times are *stream* milliseconds: audio fed to the VAD so far
(``VoiceActivityDetector.stream_ms``), so a test drives it with plain numbers.

Modes (``Policy``):

- ``server_vad``: a turn ends after ``silence_ms`` of silence. At the VAD's short pause a
  turn starts speculatively (``StartTurn``); it is committed at the silence stop
  (``Commit``) or dropped if speech resumes (``DropTurn``). Speech over the assistant for
  ``barge_in_min_ms`` cancels the reply (``BargeIn``); shorter speech is no turn (``Discard``).
- ``semantic_vad``: at the short pause the end-of-turn model scores the audio (``Score``)
  while the speculative turn runs. A score ``>= complete`` commits as soon as the speculative
  transcript is known too (``heard``) and its last words do not say the sentence goes on
  (``words_cap``: "... a joke about", "... and"); the reply needs that transcript anyway (if
  it never comes, the turn ends at ``max_silence_ms``). A lower score (or one capped by the words)
  waits for silence: from the silence stop (just under ``complete``) up to ``max_silence_ms``
  (at ``incomplete`` and below), in proportion (``Policy.wait_ms``). Before the score arrives
  the turn waits (up to ``max_silence_ms``).
- ``words_threshold`` (``semantic_vad`` with the LLM's score of the words, llm/end_of_turn.py): once
  the speculative transcript is heard its words are scored too (``ScoreWords``, reported with
  ``words_scored``). The turn is answered at the short pause only when the sound says complete
  **and** the words score at least ``words_threshold``; otherwise it waits for silence: words under
  the threshold wait at least ``long_stop_ms`` (longer than a pause inside a sentence), words over
  it at most ``long_stop_ms`` (a finished sentence the sound doubts never waits ``max_silence_ms``).
  Until the words' score is in, a turn the sound doubts waits at least ``long_stop_ms`` (recomputed
  when it arrives). A model that gives no score (None) leaves the decision to the sound.
- ``words_sure`` (with ``words_threshold``): a turn the sound doubts waits the sound's wait (at most
  ``long_stop_ms``) only when its words score at least ``words_sure``; words between the threshold and
  it wait ``long_stop_ms``: "Book me a table" is finished in its words (0.11) but not sure, and a
  900 ms pause after it outlasted the doubting sound's 722 ms.
- ``mend_ms``: speech that starts within ``mend_ms`` of the end of a committed turn's speech and
  becomes a turn continues it (``Mend``, before the new turn's ``StartTurn`` / ``Commit``): the
  reply is stopped, the two parts are one user message, and the whole is answered. Over a paused
  reply, words that start within ``long_stop_ms`` of that end (a pause inside a sentence) continue it
  even when they are an acknowledgement ("No, [pause] thanks."): nobody reacts to a reply they have
  hardly heard; sounds without words ("mm-hm", a cough) still resume the reply.
- ``pause_on_speech`` (``semantic_vad``): speech over the assistant first pauses the
  reply (``PauseReply``); its audio is transcribed at the short pause (``Transcribe``).
  If the speech ends shorter than ``barge_in_min_ms`` or its transcript has no words (a
  cough, "mm-hm", noise) the reply resumes (``ResumeReply``); words, or speech longer than
  ``pause_max_speech_ms``, cancel it (``BargeIn``) and the speech is a turn of its own.
- ``score_pause_ms`` (``semantic_vad``, ``turn.asr_pause_ms`` shorter than ``turn.pause_ms``): the
  VAD's pause comes earlier and only starts the speculative turn (its ASR, then its LLM); the score,
  and the words of speech over a paused reply, are asked once the silence reaches
  ``score_pause_ms`` (``tick``), so a commit still needs the longer pause. Speech that resumes in
  between drops the speculation as before.
- ``score_early`` (with ``score_pause_ms``; ``turn.score_early``): the score is asked already at the
  VAD's pause, with the ``StartTurn``, and used only if it says complete: a score ``>= complete``
  (with the words heard and not capping it, as any complete score) commits when the silence reaches
  ``score_pause_ms`` (``tick``; not before), so the model's run is off the critical path of a
  complete turn. An early score under ``complete`` (or capped by the words) is dropped, and a
  ``Score`` is asked when the silence reaches ``score_pause_ms``, as without ``score_early``: its
  result sets the wait for silence (the early one heard less silence after the last word and is
  lower on average; bench/turn_score_early.py). An early score not back by then is waited for and
  judged so on arrival: complete commits at once, anything else asks the ``Score``. Speech that
  resumes in between drops the score with the speculation. The words of speech over a paused reply
  are still asked at ``score_pause_ms``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Transcripts that are no words at all: sounds, fillers and what whisper makes of noise ("you").
NOISE = frozenset({"", "mm", "mmm", "hm", "hmm", "mhm", "mm-hm", "mm-hmm", "uh-huh", "uh", "um", "umm", "ah", "oh",
                   "you"})
#: Transcripts that are no words of an interruption: the sounds above and acknowledgements.
BACKCHANNELS = NOISE | {"yeah", "yep", "yes", "okay", "ok", "right", "sure", "i see", "thank you", "thanks"}
_NON_SPEECH = re.compile(r"[\[(*][^\])*]*[\])*]")  # "[coughing]", "(coughs)", "*cough*"


def _made_of(text: str, vocabulary: frozenset[str]) -> bool:
    """``text`` (a transcript, non-speech marks and punctuation aside) is one of ``vocabulary``'s entries
    ("thank you") or only its words."""
    words = " ".join(re.sub(r"[^\w\s'-]", " ", _NON_SPEECH.sub(" ", text.lower())).split())
    return words in vocabulary or all(w in vocabulary for w in words.split())


def is_backchannel(text: str) -> bool:
    """True when ``text`` (a transcript) carries no interruption: empty, noise, "mm-hm", "okay"."""
    return _made_of(text, BACKCHANNELS)


def is_noise(text: str) -> bool:
    """True when ``text`` (a transcript) has no words: empty, "[coughing]", "mm-hm", "uh"."""
    return _made_of(text, NOISE)


#: English words after which a sentence is not over: articles, possessive determiners, conjunctions,
#: fillers ("Tell me a joke about the ..."). The end-of-turn model hears prosody, not grammar, and
#: scored such cut sentences complete (bench/turn_taking.py: "Tell me a joke about" 0.98).
UNFINISHED_WORDS = frozenset("a an the my your our their and or but because um uh uhm er erm".split())
#: A preposition at the end: unfinished unless the transcript asks or exclaims ("What is it for?").
PREPOSITIONS = frozenset("about at by for from in into of on onto to with without".split())
_TRAILING_OFF = ("...", "\u2026", ",", "-", "\u2014", ":")  # whisper marks speech that trails off so
#: A turn that is only a greeting is rarely the whole turn: "Good morning." … "What is two plus two?"
#: (bench/voice_questions.txt). The model scores the greeting complete, and answering it split the turn.
GREETINGS = frozenset({
    "hello", "hi", "hey", "hiya", "greetings", "morning", "good morning", "good afternoon", "good evening",
    "good day", "hello there", "hi there", "hey there", "hello again", "hi again", "hey you",
})


def words_cap(text: str, language: str | None, policy: "Policy", greetings_only: bool = False) -> float:
    """The highest end-of-turn score a transcript's last words allow (1.0: no limit; English only).

    ``greetings_only`` (the LLM scores the words): only the greeting rule. Every unfinished head of
    bench/turn_set.py the other rules catch, the words' score puts under 0.002 (threshold 0.03);
    a greeting it calls finished (0.28-0.33), and the greeting rule still holds "Good morning." |
    "What is two plus two?" (bench/voice_questions.txt) for the silence stop.

    Trailing off ("...", a comma) or an article, conjunction or filler last: ``policy.incomplete``
    (wait the longest); a preposition last, without "?" or "!": half way between ``incomplete``
    and ``complete`` (wait longer than the silence stop, less than the longest); only a greeting
    ("Good morning.", "Hello there", not "Hello?"): just under ``complete`` (wait for the silence
    stop, so a user who goes on after it is not answered in between).
    """
    if language not in (None, "en"):
        return 1.0
    text = text.strip()
    words = re.findall(r"[a-z']+", text.lower())
    if not words:
        return 1.0
    if greetings_only:
        return policy.complete - 1e-6 if " ".join(words) in GREETINGS and not text.endswith("?") else 1.0
    if text.endswith(_TRAILING_OFF) or words[-1] in UNFINISHED_WORDS:
        return policy.incomplete
    if words[-1] in PREPOSITIONS and not text.endswith(("?", "!")):
        return (policy.incomplete + policy.complete) / 2
    if " ".join(words) in GREETINGS and not text.endswith("?"):
        return policy.complete - 1e-6
    return 1.0


@dataclass(frozen=True)
class Thresholds:
    """End-of-turn score thresholds of one ``eagerness``; ``max_silence_scale`` x ``turn.max_silence_ms``."""

    complete: float
    incomplete: float
    max_silence_scale: float


#: ``semantic_vad`` eagerness -> thresholds (docs/protocol.md). Picked on bench/turn_set.py's set.
EAGERNESS = {
    "high": Thresholds(complete=0.7, incomplete=0.15, max_silence_scale=0.5),
    "medium": Thresholds(complete=0.9, incomplete=0.3, max_silence_scale=1.0),
    "auto": Thresholds(complete=0.9, incomplete=0.3, max_silence_scale=1.0),
    "low": Thresholds(complete=0.97, incomplete=0.5, max_silence_scale=1.5),
}


@dataclass(frozen=True)
class Policy:
    """How turns end and what speech over the assistant does. Durations in ms."""

    #: Silence that ends a turn (the silence stop).
    silence_ms: int = 500
    #: Speech over the assistant must last this long to interrupt it.
    barge_in_min_ms: int = 250
    #: Use end-of-turn scores (``semantic_vad``).
    semantic: bool = False
    #: Score at or above: the turn is complete at the short pause.
    complete: float = 0.9
    #: Score at or below: the user is not done; wait up to ``max_silence_ms``.
    incomplete: float = 0.3
    #: Longest silence waited while the model says the user is not done.
    max_silence_ms: int = 2000
    #: Speech over the assistant pauses the reply first (resumed after a cough or "mm-hm").
    pause_on_speech: bool = False
    #: Speech over a paused reply that lasts this long cancels it, words or not.
    pause_max_speech_ms: int = 1000
    #: Speech over the assistant may pause or cancel its reply (``turn_detection.interrupt_response``).
    #: False: the reply plays on; the speech is still a turn when it ends (unless shorter than
    #: ``barge_in_min_ms``).
    interrupt: bool = True
    #: ``semantic_vad``: silence after the speech's end (ms, stream time) at which the end-of-turn
    #: score and the words of speech over a paused reply are asked. 0: at the VAD's pause. Longer
    #: than the VAD's pause: the speculative turn starts at the VAD's pause, the rest waits for it.
    score_pause_ms: int = 0
    #: ``semantic_vad`` with ``score_pause_ms``: ask the score at the VAD's pause already; a complete
    #: one commits once the silence reaches ``score_pause_ms`` (not before); any other is dropped and
    #: the score asked again then (as without it).
    score_early: bool = False
    #: ``semantic_vad``: the words' end-of-turn score at or above which they say the sentence is over
    #: (``ScoreWords``); None: the sound alone decides.
    words_threshold: float | None = None
    #: ``semantic_vad`` with ``words_threshold``: silence waited at least when the words are not done
    #: (and at most when they are while the sound doubts), ms.
    long_stop_ms: int = 1200
    #: ``semantic_vad`` with ``words_threshold``: the words' score at or above which a turn the sound
    #: doubts waits only the sound's wait (at most ``long_stop_ms``); under it, ``long_stop_ms``.
    words_sure: float = 0.5
    #: Speech starting within this long of a committed turn's speech end continues that turn
    #: (``Mend``), ms; 0: never.
    mend_ms: int = 0

    @classmethod
    def semantic_vad(cls, eagerness: str, silence_ms: int, barge_in_min_ms: int, max_silence_ms: int,
                     pause_on_speech: bool, pause_max_speech_ms: int, interrupt: bool = True,
                     score_pause_ms: int = 0, score_early: bool = False, words_threshold: float | None = None,
                     long_stop_ms: int = 1200, words_sure: float = 0.5, mend_ms: int = 0) -> "Policy":
        t = EAGERNESS[eagerness]
        max_silence = max(silence_ms, round(max_silence_ms * t.max_silence_scale))
        return cls(silence_ms=silence_ms, barge_in_min_ms=barge_in_min_ms, semantic=True,
                   complete=t.complete, incomplete=t.incomplete, max_silence_ms=max_silence,
                   pause_on_speech=pause_on_speech, pause_max_speech_ms=pause_max_speech_ms,
                   interrupt=interrupt, score_pause_ms=score_pause_ms, score_early=score_early,
                   words_threshold=words_threshold, long_stop_ms=min(long_stop_ms, max_silence), words_sure=words_sure,
                   mend_ms=mend_ms)

    def wait_ms(self, probability: float) -> float:
        """Silence to wait after a score under ``complete``: ``silence_ms`` just under it, growing
        linearly to ``max_silence_ms`` at ``incomplete`` (a pause mid-sentence is often longer
        than the silence stop, and the model is not sure of every ending)."""
        span = max(self.complete - self.incomplete, 1e-6)
        unsure = min(max((self.complete - probability) / span, 0.0), 1.0)
        return self.silence_ms + (self.max_silence_ms - self.silence_ms) * unsure

    @property
    def vad_silence_ms(self) -> int:
        """Silence after which the VAD itself ends an utterance (the longest this policy waits)."""
        return self.max_silence_ms if self.semantic else self.silence_ms


# --------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class StartTurn:
    """Start a voice turn for ``utterance`` on its audio so far; speculative ones are held until committed."""

    utterance: int
    speculative: bool


@dataclass(frozen=True)
class Commit:
    """The user's turn ``utterance`` is over: release its speculative turn, else start a committed one.

    ``end_utterance``: the VAD still thinks the user is in a pause; end its utterance now.
    """

    utterance: int
    end_utterance: bool = False


@dataclass(frozen=True)
class DropTurn:
    """Drop the speculative turn of ``utterance`` silently (speech resumed, or it was no turn)."""

    utterance: int


@dataclass(frozen=True)
class Discard:
    """The utterance is no turn (a cough over the assistant): no commit, its speculation is dropped.

    ``end_utterance``: the VAD still thinks the user is in a pause; end its utterance now.
    """

    utterance: int
    end_utterance: bool = False


@dataclass(frozen=True)
class Score:
    """Score the end of turn of ``utterance``'s audio so far; report with ``scored()``.

    ``early`` (``score_early``): asked at the VAD's pause with the speculative turn, so on the audio
    that pause carries (what its ASR gets), not on what arrived after it in the same append."""

    utterance: int
    early: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ScoreWords:
    """Score the end of turn of ``utterance``'s speculative transcript ``text`` from its words;
    report with ``words_scored()``."""

    utterance: int
    text: str


@dataclass(frozen=True)
class Mend:
    """The turn of ``utterance`` (just committed) goes on in the one starting now: stop its reply, and
    make the two one user turn (the next ``StartTurn`` / ``Commit`` is of the whole)."""

    utterance: int


@dataclass(frozen=True)
class Transcribe:
    """Transcribe ``utterance``'s audio so far (speech over a paused reply); report with ``transcribed()``."""

    utterance: int


@dataclass(frozen=True)
class BargeIn:
    """Cancel the assistant's reply; keep in history what the user heard."""


@dataclass(frozen=True)
class PauseReply:
    """Stop the reply's playback where it is; the reply keeps being made."""


@dataclass(frozen=True)
class ResumeReply:
    """Play the paused reply on from where it stopped."""


Decision = (StartTurn | Commit | DropTurn | Discard | Score | ScoreWords | Mend | Transcribe | BargeIn | PauseReply
            | ResumeReply)

IDLE, SPEAKING, PAUSED = "idle", "speaking", "paused"


class TurnTaking:
    """The turn-taking state of one session (one VAD stream)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.utterance = 0
        self.state = IDLE
        self._speech_start_ms = 0.0
        self._speech_end_ms = 0.0
        self._speculating = False
        self._deadline_ms: float | None = None
        self._judge_at_ms: float | None = None  # score_pause_ms: when the score / words are asked
        self._interrupted = False  # this utterance already cancelled the reply
        self._paused_by: int | None = None  # the utterance that paused the reply
        self._transcript: str | None = None  # of the pausing utterance, once known
        self._waiting_words = False  # the pausing utterance ended; its transcript decides
        self._score: float | None = None  # of the speculation at this pause
        self._early = False  # score_early: the score asked (or kept) is the one asked at the VAD's pause
        self._words: tuple[str, str | None] | None = None  # its transcript and language
        self._text: float | None = None  # the words' score (None: not known, or no score)
        self._text_wait = False  # ScoreWords asked, no answer yet
        self._committed: tuple[int, float] | None = None  # the last committed utterance, its speech end
        self._mend: int | None = None  # the utterance this one continues, until its turn starts

    @property
    def reply_paused(self) -> bool:
        return self._paused_by is not None

    # ----------------------------------------------------------------- VAD events
    def speech_started(self, t_ms: float, audible: bool) -> list[Decision]:
        """Speech began at ``t_ms``; ``audible``: the assistant's reply may be playing."""
        out: list[Decision] = []
        if self._waiting_words:  # the user speaks again before the words of the last burst are known
            out = self._interruption(self._paused_by, vad_ended=True)
        self.utterance += 1
        self.state = SPEAKING
        self._speech_start_ms = t_ms
        last, p = self._committed, self.policy
        self._mend = last[0] if last is not None and p.mend_ms > 0 and t_ms - last[1] <= p.mend_ms else None
        self._speculating = False
        self._deadline_ms = self._judge_at_ms = None
        self._interrupted = False
        if audible and self._pauses_replies and not self.reply_paused and not out:
            self._paused_by, self._transcript = self.utterance, None
            out.append(PauseReply())
        return out

    def paused(self, t_ms: float, audible: bool) -> list[Decision]:
        """Silence inside speech reached the short pause; speech last ended at ``t_ms``."""
        if self.state != SPEAKING:
            return []
        self.state = PAUSED
        self._speech_end_ms = t_ms
        p = self.policy
        later = p.semantic and p.score_pause_ms > 0  # the score / words wait for the longer pause
        self._judge_at_ms = t_ms + p.score_pause_ms if later else None
        if self._paused_by == self.utterance:  # over the paused reply: its words decide
            self._deadline_ms = t_ms + p.silence_ms
            return [] if later else [Transcribe(self.utterance)]
        # server_vad ends at the VAD's own silence stop; semantic_vad waits for the score first
        self._deadline_ms = t_ms + p.max_silence_ms if p.semantic else None
        if audible:
            return []  # speech over the playing reply: no turn is started for it yet
        return self._speculate(score=not later or p.score_early, early=later and p.score_early)

    def resumed(self, t_ms: float) -> list[Decision]:
        """Speech came back after the short pause: the speculation is stale."""
        if self.state != PAUSED:
            return []
        self.state = SPEAKING
        self._deadline_ms = self._judge_at_ms = None
        self._transcript = None
        self._score = self._words = self._text = None
        self._early = self._text_wait = False
        if self._speculating:
            self._speculating = False
            return [DropTurn(self.utterance)]
        return []

    def speech_ended(self, t_ms: float, forced: bool, audible: bool) -> list[Decision]:
        """The VAD ended the utterance (its silence stop, ``max_utterance_s`` or a flush)."""
        if self.state == IDLE:
            return []
        if self.state == SPEAKING:
            self._speech_end_ms = t_ms
        return self._end_of_turn(audible, vad_ended=True)

    # ----------------------------------------------------------------- other inputs
    def tick(self, now_ms: float, audible: bool) -> list[Decision]:
        """Stream time reached ``now_ms`` (after each audio append)."""
        p = self.policy
        speaking_ms = now_ms - self._speech_start_ms
        if self.state == SPEAKING and self._paused_by == self.utterance and speaking_ms >= p.pause_max_speech_ms:
            self._paused_by = None  # too long for a cough or an "mm-hm"
            self._interrupted = True
            return [BargeIn()]
        if (self.state == SPEAKING and audible and p.interrupt and not self._interrupted and self._paused_by is None
                and speaking_ms >= p.barge_in_min_ms):
            self._interrupted = True
            return [BargeIn()]
        out: list[Decision] = []
        if self.state == PAUSED and self._judge_at_ms is not None and now_ms >= self._judge_at_ms:
            self._judge_at_ms = None
            out = self._judge(now_ms, audible)
        if self.state == PAUSED and self._deadline_ms is not None and now_ms >= self._deadline_ms:
            out += self._end_of_turn(audible, vad_ended=False)
        return out

    def scored(self, utterance: int, probability: float, now_ms: float, audible: bool) -> list[Decision]:
        """The end-of-turn model's ``probability`` that ``utterance`` is complete (0..1).

        The early score (``score_early``) is kept until ``score_pause_ms``; ``tick`` judges it then."""
        if utterance != self.utterance or self.state != PAUSED or not self._speculating:
            return []  # stale: speech resumed or the turn already ended
        self._score = probability
        if self._judge_at_ms is not None:
            return []
        if self._early:
            return self._judge_early(audible) + self.tick(now_ms, audible)
        return self._decide(now_ms, audible)

    def heard(self, utterance: int, text: str, language: str | None, now_ms: float, audible: bool) -> list[Decision]:
        """The speculative turn's transcript of ``utterance`` (``semantic_vad``: its last words count)."""
        if (not self.policy.semantic or utterance != self.utterance or self.state != PAUSED
                or not self._speculating):
            return []
        self._words = (text, language)
        out: list[Decision] = []
        if self.policy.words_threshold is not None:
            self._text_wait = True
            out.append(ScoreWords(utterance, text))
        return out + self._judge_known(now_ms, audible)

    def words_scored(self, utterance: int, probability: float | None, now_ms: float, audible: bool) -> list[Decision]:
        """The words' end-of-turn ``probability`` (asked by ``ScoreWords``; None: the model gave none)."""
        if utterance != self.utterance or self.state != PAUSED or not self._speculating or not self._text_wait:
            return []
        self._text, self._text_wait = probability, False
        return self._judge_known(now_ms, audible)

    def _judge_known(self, now_ms: float, audible: bool) -> list[Decision]:
        """Judge what is known of the speculation (once the score is asked and back)."""
        if self._score is None or self._judge_at_ms is not None:
            return []
        if self._early:
            return self._judge_early(audible) + self.tick(now_ms, audible)
        return self._decide(now_ms, audible)

    def transcribed(self, utterance: int, text: str) -> list[Decision]:
        """Transcript of ``utterance``'s audio (asked by ``Transcribe``: speech over the paused reply)."""
        if utterance != self._paused_by or utterance != self.utterance or self.state == SPEAKING:
            return []  # stale, or speech went on after it (a later pause asks again)
        self._transcript = text
        if self._waiting_words or self.state == PAUSED:
            return self._settle(utterance, vad_ended=self._waiting_words)
        return []

    def cleared(self) -> list[Decision]:
        """The client committed or cleared the input buffer: the utterance in progress is gone."""
        out: list[Decision] = [ResumeReply()] if self.reply_paused else []
        self.state = IDLE
        self._speculating = False
        self._deadline_ms = None
        self._paused_by, self._waiting_words = None, False
        return out

    def reply_ended(self) -> None:
        """The reply was cancelled or finished playing: nothing is paused any more."""
        self._paused_by = None
        self._waiting_words = False

    # ----------------------------------------------------------------- internals
    @property
    def _pauses_replies(self) -> bool:
        return self.policy.semantic and self.policy.pause_on_speech and self.policy.interrupt

    def _decide(self, now_ms: float, audible: bool) -> list[Decision]:
        """Score known: commit now, or wait for silence as long as the score (capped by the words) says."""
        p = self.policy
        assert self._score is not None
        probability = self._score
        if self._words is not None:
            probability = min(probability, words_cap(*self._words, p, greetings_only=self._text is not None))
        if probability >= p.complete and (self._words is None or self._text_wait):
            # Complete by the sound: the words may still say otherwise. Waiting costs little: the words'
            # score is read from the reply's own prompt, in the step its first token comes from.
            return self.tick(now_ms, audible)
        text = self._text
        if probability >= p.complete and (text is None or text >= (p.words_threshold or 0.0)):
            return self._end_of_turn(audible, vad_ended=False)
        wait = p.wait_ms(probability) if probability < p.complete else p.silence_ms
        if p.words_threshold is not None and (self._words is None or self._text_wait):
            # The words' score is still to come (a slow step under load): they may say the sentence
            # goes on, so the sound's shorter wait must not end the turn before they are in.
            wait = max(wait, p.long_stop_ms)
        elif text is not None and p.words_threshold is not None:
            if text >= p.words_sure:
                wait = min(wait, p.long_stop_ms)  # sure words: the sound's wait, never max_silence_ms
            elif text >= p.words_threshold:
                wait = p.long_stop_ms  # finished words, not sure, a doubting sound: the longer stop
            else:
                wait = max(wait, p.long_stop_ms)
        self._deadline_ms = self._speech_end_ms + wait
        return self.tick(now_ms, audible)

    def _speculate(self, score: bool = True, early: bool = False) -> list[Decision]:
        """Start the speculative turn; with ``score``, ask for the end-of-turn score now too (``early``:
        ahead of ``score_pause_ms``, ``score_early``)."""
        self._speculating = True
        self._score = self._words = self._text = None
        self._early, self._text_wait = early, False
        out: list[Decision] = [*self._mending(), StartTurn(self.utterance, speculative=True)]
        if self.policy.semantic and score:
            out.append(Score(self.utterance, early=early))
        return out

    def _judge(self, now_ms: float, audible: bool) -> list[Decision]:
        """The silence reached ``score_pause_ms``: ask what the VAD's earlier pause did not, or judge
        the score asked there (``score_early``; if it has not come yet, ``scored`` judges it)."""
        if self._paused_by == self.utterance:
            return [Transcribe(self.utterance)]
        if not self._speculating:
            return []
        if not self._early:
            return [Score(self.utterance)]
        return [] if self._score is None else self._judge_early(audible)

    def _judge_early(self, audible: bool) -> list[Decision]:
        """``score_early``, the silence at ``score_pause_ms``: the early score commits if it says
        complete (the words heard and not capping it); under ``complete`` it is dropped and the score
        asked again, now, as without ``score_early`` (that one sets the wait for silence)."""
        p = self.policy
        assert self._score is not None
        probability = self._score
        if self._words is not None:
            probability = min(probability, words_cap(*self._words, p, greetings_only=self._text is not None))
        if probability < p.complete:
            self._early, self._score = False, None
            return [Score(self.utterance)]
        if self._words is None or self._text_wait:
            return []  # complete by the model: the words may still say otherwise (``heard`` judges)
        if self._text is not None and p.words_threshold is not None and self._text < p.words_threshold:
            self._early = False  # complete by the sound, not by the words: wait for the longer stop
            self._deadline_ms = self._speech_end_ms + max(p.silence_ms, p.long_stop_ms)
            return []
        return self._end_of_turn(audible, vad_ended=False)

    def _end_of_turn(self, audible: bool, vad_ended: bool) -> list[Decision]:
        utt = self.utterance
        speech_ms = self._speech_end_ms - self._speech_start_ms
        if self._paused_by == utt:
            if speech_ms < self.policy.barge_in_min_ms:
                self._paused_by = None
                self.state = IDLE
                return [ResumeReply(), Discard(utt, end_utterance=not vad_ended)]
            if self._transcript is None:
                self._deadline_ms = None
                if vad_ended:  # the VAD has ended it: wait for the words in the idle state
                    self.state, self._waiting_words = IDLE, True
                return []
            return self._settle(utt, vad_ended)
        self.state = IDLE
        self._deadline_ms = None
        self._speculating = False
        if audible and not self._interrupted and speech_ms < self.policy.barge_in_min_ms:
            return [Discard(utt, end_utterance=not vad_ended)]
        return self._commit(utt, vad_ended)

    def _commit(self, utt: int, vad_ended: bool) -> list[Decision]:
        out = [*self._mending(), Commit(utt, end_utterance=not vad_ended)]
        self._committed = (utt, self._speech_end_ms)
        return out

    def _mending(self) -> list[Decision]:
        """``Mend`` once, when this utterance continues a committed one and becomes a turn."""
        if self._mend is None:
            return []
        mend, self._mend = Mend(self._mend), None
        return [mend]

    def _goes_on(self) -> bool:
        """This utterance continues the committed one and began within ``long_stop_ms`` of its speech
        end (a pause inside a sentence): the user going on, not a reaction to a reply hardly heard."""
        return (self._mend is not None and self._committed is not None
                and self._speech_start_ms - self._committed[1] <= self.policy.long_stop_ms)

    def _settle(self, utt: int, vad_ended: bool) -> list[Decision]:
        """The words of the speech over the paused reply are known: resume it, or it was an interruption."""
        assert self._transcript is not None
        if is_noise(self._transcript) or (is_backchannel(self._transcript) and not self._goes_on()):
            self._paused_by, self._waiting_words = None, False
            self.state = IDLE
            return [ResumeReply(), Discard(utt, end_utterance=not vad_ended)]
        return self._interruption(utt, vad_ended)

    def _interruption(self, utt: int | None, vad_ended: bool) -> list[Decision]:
        """Words over the paused reply: cancel it; the speech is a turn of its own."""
        self._paused_by, self._waiting_words = None, False
        self._interrupted = True
        if self.state == PAUSED and not vad_ended:  # the user may go on: take the turn as usual
            return [BargeIn(), *self._speculate()]
        self.state = IDLE
        return [BargeIn(), *self._commit(utt if utt is not None else self.utterance, vad_ended)]
