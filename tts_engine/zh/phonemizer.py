"""Mixed Chinese/English text -> phonemes for a Chinese Piper voice, one sequence per sentence.

``ChinesePhonemizer(kind).phonemize(text) -> list[list[str]]`` takes text already
through ``normalize_zh`` (the ``TextFrontend`` does that) and:

1. splits it by script: Latin runs (``Python``, ``OK``) vs everything else;
2. Chinese runs: ``ChineseG2p`` pinyin per word, then
   * ``kind="espeak"``: espeak-ng ``cmn`` reads our pinyin (``yin2hang2``, words
     joined, punctuation as ASCII so it pauses) — see ``phonemes.py``;
   * ``kind="pinyin"``: initial/final/tone symbols, Chinese punctuation kept;
3. Latin runs: ``kind="espeak"`` uses espeak-ng ``en-us`` (the English path);
   ``kind="pinyin"`` voices have no English symbols, so letters are spelled with
   their Chinese letter names (``AI`` -> ``ei1 ai4``);
4. joins the runs into sentences (a run ending in 。！？.!? ends one).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from pathlib import Path

from tts_engine.espeak import EspeakPhonemizer
from tts_engine.zh import phonemes as ph
from tts_engine.zh.g2p import HANZI, ChineseG2p, Word
from tts_engine.zh.lexicon import Lexicon

#: Latin words with digits/apostrophes/hyphens inside, and the spaces between them.
_LATIN_RUN = re.compile(r"[A-Za-z][A-Za-z0-9'’\-]*(?:[ .&+]+[A-Za-z0-9][A-Za-z0-9'’\-]*)*")
_SENTENCE_END = re.compile(r"[。！？.!?…]\W*$")
_ASCII_PAUSES = frozenset(",;:.!?")
_TO_ASCII_PAUSE = {"，": ",", "、": ",", "；": ";", "：": ":", "。": ".", "！": "!", "？": "?", "…": ",", "—": ","}
#: Chinese names of Latin letters, as pinyin syllables (for pinyin-symbol voices).
LETTER_NAMES = {
    "a": "ei1", "b": "bi4", "c": "xi1", "d": "di4", "e": "yi4", "f": "ai2 fu5", "g": "ji4", "h": "ei1 qi1",
    "i": "ai4", "j": "jie4", "k": "kai4", "l": "ai2 le5", "m": "ai2 mu5", "n": "en1", "o": "ou1", "p": "pi4",
    "q": "qiu1", "r": "a4 er5", "s": "ai2 si1", "t": "ti4", "u": "you1", "v": "wei1", "w": "da2 bu5 liu5",
    "x": "ai2 ke4 si1", "y": "wai4", "z": "zei4",
}

_shared: dict[str | None, ChineseG2p] = {}
_shared_lock = threading.Lock()
_user_lexicon: str | None = None


def configure(lexicon_path: str | Path | None) -> None:
    """Set the user lexicon (``tts.zh_lexicon_path``) used by phonemizers built after this call."""
    global _user_lexicon
    _user_lexicon = str(lexicon_path) if lexicon_path else None


def shared_g2p(lexicon_path: str | None = None) -> ChineseG2p:
    """One ``ChineseG2p`` per lexicon path per process (building one loads jieba, ~1 s)."""
    with _shared_lock:
        g2p = _shared.get(lexicon_path)
        if g2p is None:
            g2p = _shared[lexicon_path] = ChineseG2p(Lexicon.load(lexicon_path))
        return g2p


class ChinesePhonemizer:
    """Phonemes for espeak-cmn voices (``kind="espeak"``) or pinyin-symbol voices (``kind="pinyin"``)."""

    def __init__(
        self, kind: str = "espeak", g2p: ChineseG2p | None = None, *, third_tone_sandhi: bool = False,
        english_voice: str = "en-us",
    ) -> None:
        """``third_tone_sandhi`` writes surface tones (ni2 hao3) into pinyin symbols, for checkpoints
        trained on them; Piper's pinyin voices (g2pW labels) and espeak's cmn use citation tones."""
        if kind not in ("espeak", "pinyin"):
            raise ValueError(f"kind must be 'espeak' or 'pinyin', got {kind!r}")
        self.kind = kind
        self.third_tone_sandhi = third_tone_sandhi
        self.g2p = g2p if g2p is not None else shared_g2p(_user_lexicon)
        self._chinese_voice = EspeakPhonemizer("cmn")
        self._english = EspeakPhonemizer(english_voice)

    def phonemize(self, text: str) -> list[list[str]]:
        """Normalized text -> phonemes per sentence (empty sentences dropped)."""
        sentences: list[list[str]] = [[]]
        for run, latin in split_scripts(text):
            for phonemes, closes in self._latin(run) if latin else self._chinese(run):
                current = sentences[-1]
                if self.kind == "espeak" and current and phonemes and " " not in (current[-1], phonemes[0]) \
                        and phonemes[0] not in _ASCII_PAUSES:
                    current.append(" ")
                current.extend(phonemes)
                if closes:
                    sentences.append([])
        return [s for s in (_strip_spaces(s) for s in sentences) if s]

    def pinyin_text(self, words: list[Word]) -> str:
        """What espeak cmn is given: syllables of a word joined, words spaced, pauses as ASCII."""
        out: list[str] = []
        for word in words:
            if word.is_chinese:
                out.append("".join(ph.espeak_spelling(s) for s in word.syllables))
            else:
                pause = _ascii_pause(word.text)
                if pause and out:
                    out[-1] += pause
        return " ".join(out)

    def _chinese(self, run: str) -> list[tuple[list[str], bool]]:
        """(phonemes, ends a sentence) per sentence of a Chinese run."""
        segments = []
        for words in _sentences(self.g2p.words(run)):
            closes = bool(_SENTENCE_END.search(words[-1].text)) and not words[-1].is_chinese
            if not any(w.is_chinese for w in words):  # pauses only, e.g. "。" after an English word
                pause = _ascii_pause("".join(w.text for w in words)) if self.kind == "espeak" else ""
                symbols = [pause] if pause else [ch for w in words for ch in w.text if ch in ph.PINYIN_PAUSES]
                segments.append(([s for s in symbols if s.strip()], closes))
            elif self.kind == "pinyin":
                segments.append((self._pinyin_symbols(words), closes))
            else:
                segments.append((self._espeak_words(words), closes))
        return segments

    def _pinyin_symbols(self, words: list[Word]) -> list[str]:
        chinese = [w.syllables for w in words if w.is_chinese]
        surface = iter(ph.third_tone_sandhi(chinese) if self.third_tone_sandhi else chinese)
        out: list[str] = []
        for word in words:
            if word.is_chinese:
                out += ph.pinyin_symbols(next(surface))
            else:
                out += [ch for ch in word.text if ch in ph.PINYIN_PAUSES and ch != " "]
        return out

    def _espeak_words(self, words: list[Word]) -> list[str]:
        """espeak on one sentence's pinyin; words with a syllable espeak cannot read are composed by hand."""
        out: list[str] = []
        batch: list[Word] = []

        def flush() -> None:
            text = self.pinyin_text(batch)
            if text.strip():
                if out and out[-1] != " ":
                    out.append(" ")
                out.extend(p for sentence in self._chinese_voice.phonemize(text) for p in sentence)
            batch.clear()

        for word in words:
            if word.is_chinese and any(ph.ESPEAK_UNREADABLE.fullmatch(s) for s in word.syllables):
                flush()
                if out and out[-1] != " ":
                    out.append(" ")
                out.extend(self._composed_word(word.syllables))
                out.append(" ")
                batch.append(Word("", "x"))  # keeps a following pause attached
            else:
                batch.append(word)
        flush()
        return _strip_spaces(out)

    def _composed_word(self, syllables: list[str]) -> list[str]:
        """One word's IPA with one stress mark, on its last syllable, as espeak marks words."""
        parts = []
        for syllable in syllables:
            if ph.ESPEAK_UNREADABLE.fullmatch(syllable):
                ipa = ph.compose_espeak_syllable(syllable)
            else:
                ipa = "".join(p for s in self._chinese_voice.phonemize(ph.espeak_spelling(syllable)) for p in s)
            parts.append(ipa.replace("ˈ", "").replace("ˌ", ""))
        last = parts[-1]
        vowel = next((k for k, ch in enumerate(last) if ch in "aeiouəɑɛɔyʊɤ"), 0)
        parts[-1] = last[:vowel] + "ˈ" + last[vowel:]
        return list(unicodedata.normalize("NFD", "".join(parts)))

    def _latin(self, run: str) -> list[tuple[list[str], bool]]:
        ends = bool(_SENTENCE_END.search(run))
        if self.kind == "espeak":
            sentences = self._english.phonemize(run)
            return [(s, k < len(sentences) - 1 or ends) for k, s in enumerate(sentences)]
        syllables = [s for ch in run.lower() if ch in LETTER_NAMES for s in LETTER_NAMES[ch].split()]
        return [(ph.pinyin_symbols(syllables), ends)]


def _ascii_pause(text: str) -> str:
    """The ASCII pause espeak understands for Chinese/ASCII punctuation in ``text`` ("" if none)."""
    for ch in text:
        if ch in _ASCII_PAUSES:
            return ch
        if ch in _TO_ASCII_PAUSE:
            return _TO_ASCII_PAUSE[ch]
    return ""


def _sentences(words: list[Word]) -> list[list[Word]]:
    """Split after each punctuation word that ends a sentence."""
    groups: list[list[Word]] = [[]]
    for word in words:
        groups[-1].append(word)
        if not word.is_chinese and _SENTENCE_END.search(word.text):
            groups.append([])
    return [g for g in groups if g]


def split_scripts(text: str) -> list[tuple[str, bool]]:
    """``text`` -> [(run, is_latin)] in order; runs without letters, digits or pauses are dropped."""
    runs: list[tuple[str, bool]] = []
    position = 0
    for match in _LATIN_RUN.finditer(text):
        if match.start() > position:
            runs.append((text[position : match.start()], False))
        runs.append((match.group(0), True))
        position = match.end()
    if position < len(text):
        runs.append((text[position:], False))
    return [(run, latin) for run, latin in runs if latin or HANZI.search(run) or run.strip(" ")]


def _strip_spaces(phonemes: list[str]) -> list[str]:
    start, end = 0, len(phonemes)
    while start < end and phonemes[start] == " ":
        start += 1
    while end > start and phonemes[end - 1] == " ":
        end -= 1
    return phonemes[start:end]
