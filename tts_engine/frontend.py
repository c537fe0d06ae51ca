"""Text -> phoneme ids for a Piper voice, in separately testable steps.

``TextFrontend.normalize`` (clean text) -> ``phonemize`` (phonemes per sentence)
-> ``phonemes_to_ids`` (model input ids), plus ``sentence_ids`` that chains them.

The phonemizer is chosen by the voice's ``phoneme_type`` from a small registry
(``register_phoneme_type``): "espeak" and "text" are built in; Chinese ("pinyin", and
"espeak" voices of language zh/cmn) comes from ``tts_engine.zh``, imported here on first
use (it never imports this module). Ids for espeak voices equal Piper 1.8's exactly
(``piper/phonemize_espeak.py`` + ``piper/phoneme_ids.py``).

Backend-neutral: no onnxruntime/torch imports; espeak-ng is ``tts_engine.espeak``.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tts_engine.espeak import EspeakPhonemizer
from tts_engine.voice import VoiceConfig, phoneme_ids
from base.errors import InvalidInput, ModelError

log = logging.getLogger(__name__)

#: Longest sentence handed to the model, phonemes; longer ones are cut at a word boundary.
MAX_SENTENCE_PHONEMES = 400


class Phonemizer(Protocol):
    """Normalized text -> phonemes, one list of phoneme strings per sentence."""

    def phonemize(self, text: str) -> list[list[str]]: ...


#: (phonemes, id map) -> (ids, phonemes skipped because the map lacks them).
IdEncoder = Callable[[Sequence[str], Mapping[str, Sequence[int]]], tuple[list[int], list[str]]]


def interspersed_ids(
    phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]
) -> tuple[list[int], list[str]]:
    """Piper's encoding: BOS, PAD, then each phoneme followed by PAD, then EOS."""
    return phoneme_ids(phonemes, id_map)


@dataclass(frozen=True)
class PhonemeScheme:
    """How one ``phoneme_type`` turns text into ids."""

    #: Builds the phonemizer for a voice.
    make_phonemizer: Callable[[VoiceConfig], Phonemizer]
    #: Phonemes -> ids.
    encode: IdEncoder = interspersed_ids
    #: Language rules applied after the generic cleanup (e.g. numbers for Chinese); None for none.
    normalize: Callable[[str], str] | None = None


_SCHEMES: dict[str, PhonemeScheme] = {}
#: phoneme_types (or "phoneme_type:language", which wins) of the Chinese front end, loaded on first use.
_CHINESE = ("pinyin", "espeak:zh", "espeak:cmn")


def register_phoneme_type(phoneme_type: str, scheme: PhonemeScheme) -> None:
    """Make voices with this ``phoneme_type`` usable (e.g. from a test or a notebook)."""
    _SCHEMES[phoneme_type] = scheme


def _load_chinese() -> None:
    """Register the Chinese schemes and text rules (imports jieba, pypinyin and cn2an: slow, optional)."""
    from tts_engine import zh

    for language in ("zh", "cmn"):  # "cmn" when a voice config names only its espeak voice
        register_language_rules(language, zh.normalize_zh)
        register_phoneme_type(f"espeak:{language}", PhonemeScheme(lambda _config: zh.ChinesePhonemizer("espeak")))
    register_phoneme_type("pinyin", PhonemeScheme(lambda _config: zh.ChinesePhonemizer("pinyin"), encode=zh.pinyin_ids))


def scheme_for(config: VoiceConfig) -> PhonemeScheme:
    """The registered scheme for the voice; ModelError when none is available.

    A scheme registered as "phoneme_type:language" (e.g. "espeak:zh") wins over the plain one.
    """
    specific = f"{config.phoneme_type}:{config.language}"
    if specific in _CHINESE and specific not in _SCHEMES:
        _load_chinese()
    if specific in _SCHEMES:
        return _SCHEMES[specific]
    scheme = _SCHEMES.get(config.phoneme_type)
    if scheme is None and config.phoneme_type in _CHINESE:
        try:
            _load_chinese()
        except ModuleNotFoundError as exc:
            if exc.name is None or not "tts_engine.zh".startswith(exc.name):  # zh lacks a dependency
                raise ModelError(f"phoneme_type {config.phoneme_type!r} (tts_engine.zh) needs {exc.name}: {exc}") from None
        scheme = _SCHEMES.get(config.phoneme_type)
    if scheme is None:
        raise ModelError(
            f"voice phoneme_type {config.phoneme_type!r} is not supported "
            f"(supported: {', '.join(sorted(_SCHEMES))})"
        )
    return scheme


class CodepointPhonemizer:
    """``phoneme_type = "text"``: the phonemes are the text's NFD code points, one sentence."""

    def phonemize(self, text: str) -> list[list[str]]:
        return [list(unicodedata.normalize("NFD", text))]


register_phoneme_type("espeak", PhonemeScheme(EspeakPhonemizer.for_voice))
register_phoneme_type("text", PhonemeScheme(lambda _config: CodepointPhonemizer()))


# --- normalization -----------------------------------------------------------

_WORDLESS = {"Cc", "Cf", "Cs", "Co", "Cn", "So", "Sk", "Zl", "Zp"}  # replaced by a space
_MARKS = {"Mn", "Me"}  # variation selectors, emoji keycaps; combining accents are composed by NFC
_SPACES = re.compile(r"\s+")
_CURRENCY_NAMES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
                   "£": ("pound", "pounds", "penny", "pence")}
_SCALED_MONEY = re.compile(r"([$€£])\s?(\d[\d,]*(?:\.\d+)?)\s*(thousand|million|billion|trillion)\b")
_MONEY = re.compile(r"([$€£])\s?(\d[\d,]*)(?:\.(\d\d))?(?!\d)")
_ENGLISH_SYMBOLS = [
    (re.compile(r"\s*&\s*"), " and "),
    (re.compile(r"(\d)\s*%"), r"\1 percent"),
    (re.compile(r"%"), " percent "),
    (re.compile(r"\s*°\s*C\b"), " degrees Celsius"),
    (re.compile(r"\s*°\s*F\b"), " degrees Fahrenheit"),
    (re.compile(r"\s*°"), " degrees"),
    (re.compile(r"#\s?(\d)"), r"number \1"),
]


def _money(match: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY_NAMES[match.group(1)]
    whole, cents = match.group(2), match.group(3)
    cents_words = f"{int(cents)} {sub_one if cents == '01' else sub_many}" if cents and cents != "00" else ""
    if whole == "0" and cents_words:
        return cents_words
    return f"{whole} {one if whole == '1' else many} {cents_words}".rstrip()


def normalize_english(text: str) -> str:
    """Spell out the symbols espeak-ng reads badly or not at all: & % ° # and money amounts."""
    text = _SCALED_MONEY.sub(lambda m: f"{m.group(2)} {m.group(3)} {_CURRENCY_NAMES[m.group(1)][1]}", text)
    text = _MONEY.sub(_money, text)
    for pattern, replacement in _ENGLISH_SYMBOLS:
        text = pattern.sub(replacement, text)
    return text


_LANGUAGE_RULES: dict[str, Callable[[str], str]] = {"en": normalize_english}


def register_language_rules(language: str, rules: Callable[[str], str]) -> None:
    """Text rules run before the generic cleanup for voices of ``language`` (e.g. "zh": numbers, ℃)."""
    _LANGUAGE_RULES[language] = rules


def clean_text(text: str) -> str:
    """NFC; control/format characters, emoji and other pictographs -> space; whitespace collapsed."""
    out = []
    for ch in unicodedata.normalize("NFC", text):
        category = unicodedata.category(ch)
        if category in _MARKS and not (out and out[-1].isalpha()):
            continue
        out.append(" " if category in _WORDLESS else ch)
    return _SPACES.sub(" ", "".join(out)).strip()


def is_speakable(text: str) -> bool:
    """True when ``text`` has at least one letter or digit."""
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)


# --- the front end ------------------------------------------------------------


class TextFrontend:
    """normalize -> phonemize -> phonemes_to_ids for one voice.

    Text without a letter or digit (empty, only punctuation or emoji) yields no
    sentences: callers get an empty result, not an error, because a streamed clause
    like "..." is normal. Text longer than ``max_text_chars`` raises InvalidInput.
    """

    def __init__(
        self,
        config: VoiceConfig,
        phonemizer: Phonemizer | None = None,
        *,
        max_text_chars: int | None = None,
        max_sentence_phonemes: int = MAX_SENTENCE_PHONEMES,
    ) -> None:
        self.config = config
        self._scheme = scheme_for(config)
        self.phonemizer = phonemizer or self._scheme.make_phonemizer(config)
        self.max_text_chars = max_text_chars
        self.max_sentence_phonemes = max_sentence_phonemes
        #: Phonemes skipped because the voice's id map lacks them, with counts.
        self.unknown_phonemes: Counter[str] = Counter()

    def normalize(self, text: str) -> str:
        """Clean text for the phonemizer (see ``clean_text``) plus the voice language's rules."""
        rules = _LANGUAGE_RULES.get(self.config.language)
        text = unicodedata.normalize("NFC", text)
        if rules is not None:
            text = rules(text)
        text = clean_text(text)
        if self._scheme.normalize is not None:
            text = self._scheme.normalize(text)
        return text

    def phonemize(self, text: str) -> list[list[str]]:
        """Phonemes per sentence; the voice's ``phoneme_map`` applied; empty sentences dropped."""
        sentences = self.phonemizer.phonemize(text)
        phoneme_map = self.config.phoneme_map
        if phoneme_map:
            sentences = [[q for p in s for q in phoneme_map.get(p, (p,))] for s in sentences]
        return [s for s in sentences if s]

    def phonemes_to_ids(self, phonemes: Sequence[str]) -> list[int]:
        """Model input ids (Piper's BOS/PAD/EOS layout); unknown phonemes are skipped and counted."""
        ids, skipped = self._scheme.encode(phonemes, self.config.phoneme_id_map)
        for phoneme in skipped:
            if phoneme not in self.unknown_phonemes:
                log.warning("phoneme %r is not in the voice's id map; skipped", phoneme)
            self.unknown_phonemes[phoneme] += 1
        return ids

    def sentence_ids(self, text: str) -> Iterator[list[int]]:
        """Ids per sentence for raw ``text``: limit check, normalize, phonemize, split, encode.

        Raises InvalidInput when ``text`` is longer than ``max_text_chars``.
        """
        self.check_length(text)
        text = self.normalize(text)
        if not is_speakable(text):
            return iter(())
        sentences = [part for s in self.phonemize(text) for part in self._split_long(s)]
        return (self.phonemes_to_ids(s) for s in sentences)

    def check_length(self, text: str) -> None:
        if self.max_text_chars is not None and len(text) > self.max_text_chars:
            raise InvalidInput(
                f"text has {len(text)} characters; the limit is {self.max_text_chars} (limits.max_text_chars)"
            )

    def _split_long(self, phonemes: list[str]) -> Iterator[list[str]]:
        """Cut sentences over ``max_sentence_phonemes`` after a clause or word boundary."""
        limit = self.max_sentence_phonemes
        while len(phonemes) > limit:
            head = phonemes[:limit]
            spaces = [i for i, p in enumerate(head) if p == " " and i > 0]
            clause_ends = [i for i in spaces if head[i - 1] in ",:;" and i >= limit // 2]
            cut = (clause_ends or spaces or [limit - 1])[-1] + 1
            yield phonemes[:cut]
            phonemes = phonemes[cut:]
        if phonemes:
            yield phonemes
