"""A turn-taking set made with the bundled voice: complete and incomplete utterances, paused
sentences, trailing fillers and cough-like bursts (16 kHz int16).

The voice says every text with a sentence's final intonation, so an *incomplete* utterance is
cut out of the whole sentence after a word (whisper word timestamps find the cut): it keeps
the pitch of a speaker who is not done. A *paused* utterance is that cut, a silence
(``gap_ms``), then the rest of the sentence: one turn whose true end is the sentence's end.
A *filler* utterance is a cut followed by "um" said alone.

Held apart from those (they chose the end-of-turn thresholds of issue 14): ``MIDPAUSE``, sentences
with one pause of 300-900 ms at a natural break point (after "take", "for", "about", "the", a
verb, a comma; kind ``midpause``), and ``SHORT_ANSWERS``, complete short replies ("Yes.",
"Left rear."; kind ``short``), each after the assistant's question it answers ("Which tire is
flat?"): a benchmark adds the question to the conversation before the answer is spoken.

    from bench.turn_set import TurnSet
    clips = TurnSet.from_config(cfg).build()   # [Clip(name, kind, pcm, speech_end_ms), …]
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16000
#: The instructions of ``bench.turn_taking``'s sessions (and ``bench.words_threshold``'s replay).
SHORT = "Answer in one short sentence."
#: Kinds of ``TurnSet``'s clips that ``bench.turn_taking`` plays as turns.
SET_KINDS = ("complete", "paused", "filler", "midpause", "short")

#: (sentence, the word after which its incomplete cut ends).
SENTENCES = (
    ("I'd like to book a table for four people tonight.", "for"),
    ("What's the capital of France?", "of"),
    ("Could you remind me to call my mother tomorrow at noon?", "mother"),
    ("Can you recommend a good book about the history of Rome?", "about"),
    ("I think that we should leave early tomorrow.", "that"),
    ("Tell me a joke about cats and dogs.", "about"),
    ("How long does it take to boil an egg?", "take"),
    ("Please turn on the lights in the kitchen.", "the"),
)


#: (sentence, the word after which it pauses, the pause in ms): held apart from ``SENTENCES``.
MIDPAUSE = (
    ("How long does it take to get to the airport?", "take", 600),
    ("I'm looking for a restaurant that serves vegan food.", "for", 450),
    ("Can you tell me about the weather this weekend?", "about", 750),
    ("What's the best way to learn the guitar?", "the", 300),
    ("Could you play some music for my daughter?", "play", 900),
    ("I want to order a large pizza with mushrooms.", "order", 600),
    ("Remind me to water the plants, tomorrow morning.", "plants", 750),
    ("Send a message to John saying I'll be late.", "to", 450),
    ("What do you know about the history of jazz?", "about", 900),
    ("Set a timer for twenty minutes please.", "for", 300),
    ("How much does it cost to fly to Tokyo?", "cost", 600),
    ("Can you find me a recipe for chocolate cake?", "for", 750),
    ("I need to buy a birthday present for my sister.", "buy", 450),
    ("When does the next train leave for Boston?", "the", 900),
    ("Tell me something interesting about octopuses.", "about", 600),
    ("Is it going to rain in London tomorrow?", "rain", 300),
    ("Please add milk and eggs to my shopping list.", "add", 750),
    ("What is the difference between a frog and a toad?", "between", 450),
    ("Book me a table at an Italian place for eight.", "at", 900),
    ("How many calories are there in a banana?", "in", 600),
    ("Can you explain how a rainbow is formed?", "explain", 750),
    ("Where can I park my car near the stadium?", "park", 300),
    ("Call my brother and tell him I'm on my way.", "and", 450),
    ("What should I cook for dinner with chicken and rice?", "for", 900),
    ("Translate good night into Spanish for me.", "into", 600),
    ("Who wrote the novel about the white whale?", "the", 750),
    ("Could you turn the volume down in the bedroom?", "turn", 300),
    ("Do you know if the museum is open on Sundays?", "if", 450),
    ("Give me three ideas for a rainy afternoon.", "for", 900),
    ("My flight was cancelled, so I need a new one.", "cancelled", 600),
    ("Start a workout playlist with upbeat songs.", "with", 750),
    ("How do I change the battery in my smoke alarm?", "change", 450),
)

#: Complete short answers, each with the assistant's question it answers: a turn the words alone
#: might take for unfinished. Out of context they are: in bench.words_threshold's conversations the
#: bundled model scored "About an hour." 0.007 after the previous turn's reply, 0.24 after its question.
SHORT_ANSWERS = (
    ("Yes.", "Would you like me to set a reminder?"), ("No.", "Do you need anything else?"),
    ("Left rear.", "Which tire is flat?"), ("Tomorrow at five.", "When should I schedule the meeting?"),
    ("Sure, go ahead.", "Can I read you the list?"), ("Not really.", "Are you hungry?"),
    ("Two please.", "How many tickets do you want?"), ("The blue one.", "Which shirt do you like?"),
    ("Next Tuesday.", "When is your appointment?"), ("That's right.", "So a table for four at seven?"),
    ("Maybe later.", "Shall I play some music?"), ("Thank you.", "Here is your receipt."),
    ("In the kitchen.", "Where did you leave your keys?"), ("About an hour.", "How long does the drive take?"),
    ("Paris.", "Which city are you flying to?"), ("Yes, please.", "Would you like some tea?"),
    ("No, thanks.", "Do you want dessert?"), ("Seven thirty.", "What time should I wake you?"),
    ("Both of them.", "Which of the two files should I delete?"),
    ("I don't know.", "What is the capital of Burkina Faso?"),
)


@dataclass(frozen=True, eq=False)
class Clip:
    """One utterance: ``pcm`` (int16, 16 kHz); ``speech_end_ms``: where its last word ends.

    ``kind``: ``complete`` | ``incomplete`` | ``paused`` | ``filler`` | ``cough`` | ``midpause`` | ``short``.
    """

    name: str
    kind: str
    pcm: np.ndarray
    speech_end_ms: float


def cough(seed: int, ms: int = 300) -> np.ndarray:
    """A cough-like burst: band-limited noise with a fast attack and a decay (int16)."""
    rng = np.random.default_rng(seed)
    n = SAMPLE_RATE * ms // 1000
    noise = rng.standard_normal(n + 64)
    noise = np.convolve(noise, np.hanning(24) / 12, mode="same")[:n]  # darker than white noise
    t = np.arange(n) / n
    env = np.minimum(t * 20, 1.0) * np.exp(-4 * t)
    return (0.5 * 32767 * env * noise / np.abs(noise).max()).astype(np.int16)


class TurnSet:
    """Builds the clips with a TTS engine (``synthesize(text, options)``) and a faster-whisper model."""

    def __init__(self, tts, whisper) -> None:
        self.tts = tts
        self.whisper = whisper

    @classmethod
    def from_config(cls, cfg) -> "TurnSet":
        from faster_whisper import WhisperModel

        from tts_engine.cpu_engine import OnnxTtsEngine
        from base.models import resolve_asr

        whisper = WhisperModel(str(resolve_asr(cfg).path), device="cpu", compute_type="int8", cpu_threads=2)
        return cls(OnnxTtsEngine.from_config(cfg), whisper)

    def say(self, text: str) -> np.ndarray:
        """``text`` in the bundled voice without its random variation (the same samples every run)."""
        from tts_engine.engine import SynthesisOptions

        chunks = self.tts.synthesize(text, SynthesisOptions(noise_scale=0.0, noise_w=0.0, sample_rate=SAMPLE_RATE))
        return np.concatenate([c.pcm for c in chunks]).astype(np.int16)

    def cut_after(self, pcm: np.ndarray, word: str) -> int:
        """Sample index where the first ``word`` ends (whisper word timestamps)."""
        segments, _ = self.whisper.transcribe(pcm.astype(np.float32) / 32768, language="en",
                                              word_timestamps=True, beam_size=1)
        for seg in segments:
            for w in seg.words or ():
                if w.word.strip(" ,.?!").lower() == word:
                    return int(w.end * SAMPLE_RATE)
        raise ValueError(f"{word!r} not heard in the synthesized sentence")

    def build(self, gap_ms: int = 600, coughs: int = 10) -> list[Clip]:
        clips: list[Clip] = []
        um = trim(self.say("um"))
        gap = np.zeros(SAMPLE_RATE * gap_ms // 1000, np.int16)
        for i, (text, word) in enumerate(SENTENCES):
            whole = trim(self.say(text))
            cut = self.cut_after(whole, word)
            head, rest = whole[:cut], whole[cut:]
            clips.append(Clip(f"complete-{i}", "complete", whole, _ms(whole)))
            clips.append(Clip(f"incomplete-{i}", "incomplete", head, _ms(head)))
            paused = np.concatenate((head, gap, rest))
            clips.append(Clip(f"paused-{i}", "paused", paused, _ms(paused)))
            filler = np.concatenate((head, um, gap, rest))
            clips.append(Clip(f"filler-{i}", "filler", filler, _ms(filler)))
        for i in range(coughs):
            burst = cough(i, ms=250 + 20 * i)
            clips.append(Clip(f"cough-{i}", "cough", burst, _ms(burst)))
        return clips

    def held_apart(self) -> list[Clip]:
        """``MIDPAUSE`` (kind ``midpause``) and ``SHORT_ANSWERS`` (kind ``short``)."""
        clips: list[Clip] = []
        for i, (text, word, gap_ms) in enumerate(MIDPAUSE):
            whole = trim(self.say(text))
            cut = self.cut_after(whole, word)
            paused = np.concatenate((whole[:cut], np.zeros(SAMPLE_RATE * gap_ms // 1000, np.int16), whole[cut:]))
            clips.append(Clip(f"midpause-{i}", "midpause", paused, _ms(paused)))
        for i, (text, _) in enumerate(SHORT_ANSWERS):
            pcm = trim(self.say(text))
            clips.append(Clip(f"short-{i}", "short", pcm, _ms(pcm)))
        return clips


def texts() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The clips of ``TurnSet.build`` (coughs aside) and ``TurnSet.held_apart`` as text, in their order:
    (name, kind, what is said, the words said before each pause)."""
    out: list[tuple[str, str, str, tuple[str, ...]]] = []
    for i, (text, word) in enumerate(SENTENCES):
        cut = head(text, word)
        out += [(f"complete-{i}", "complete", text, ()), (f"incomplete-{i}", "incomplete", cut, ()),
                (f"paused-{i}", "paused", text, (cut,)), (f"filler-{i}", "filler", text, (f"{cut} um",))]
    out += [(f"midpause-{i}", "midpause", text, (head(text, word),)) for i, (text, word, _) in enumerate(MIDPAUSE)]
    out += [(f"short-{i}", "short", text, ()) for i, (text, _) in enumerate(SHORT_ANSWERS)]
    return out


def asked(name: str) -> str | None:
    """The assistant's question a turn of the set answers (``short-N``), else None."""
    kind, _, i = name.rpartition("-")
    return SHORT_ANSWERS[int(i)][1] if kind == "short" else None


def head(text: str, word: str) -> str:
    """``text`` up to and with the first ``word`` (the incomplete utterance's words)."""
    words = text.split()
    for i, w in enumerate(words):
        if w.strip(",.?!").lower() == word:
            return " ".join(words[:i + 1]).rstrip(",")
    raise ValueError(f"{word!r} not in {text!r}")


def trim(pcm: np.ndarray, level: int = 200, tail_level: int = 60) -> np.ndarray:
    """Drop the voice's leading silence and trailing near-silence (soft word endings are kept)."""
    loud = np.flatnonzero(np.abs(pcm) > level)
    soft = np.flatnonzero(np.abs(pcm) > tail_level)
    return pcm if len(loud) == 0 else pcm[loud[0]: soft[-1] + 1]


def _ms(pcm: np.ndarray) -> float:
    return 1000 * len(pcm) / SAMPLE_RATE


def questions() -> list[tuple[str, str, list[str]]]:
    """``bench/voice_questions.txt``: (name, kind: ``question`` or with pauses ``paused_question``, the
    parts between its 300 ms pauses)."""
    from bench.harness import ROOT

    lines = (ROOT / "bench" / "voice_questions.txt").read_text().splitlines()
    parts = [(f"question-{i}", [p.strip() for p in line.split("|")]) for i, line in enumerate(lines)
             if line.strip() and not line.startswith("#")]
    return [(name, "question" if len(said) == 1 else "paused_question", said) for name, said in parts]


def set_texts() -> list[dict]:
    """``bench.turn_taking``'s turns (``build_set``) as text, in its order (no human recordings):
    ``{name, kind, text, heads, asked}``, ``heads`` the words said before each pause, ``asked`` the
    assistant's question the turn answers (None: none)."""
    turns = [{"name": n, "kind": k, "text": t, "heads": list(h), "asked": asked(n)}
             for n, k, t, h in texts() if k in SET_KINDS]
    for name, kind, parts in questions():
        turns.append({"name": name, "kind": kind, "text": " ".join(parts),
                      "heads": [" ".join(parts[:i]) for i in range(1, len(parts))], "asked": None})
    return turns


def conversations(turns: list[dict], seed: int, session_turns: int | None) -> list[list[dict]]:
    """Talker ``seed``'s turns in its order, one list per conversation (every ``session_turns``)."""
    order = list(turns)
    random.Random(seed).shuffle(order)
    step = session_turns or len(order) or 1
    return [order[start:start + step] for start in range(0, len(order), step)]
