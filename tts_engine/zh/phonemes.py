"""Pinyin syllables -> the phonemes Chinese Piper voices take.

Two kinds of voice:

* espeak-ng voices (``phoneme_type = "espeak"``, espeak voice ``cmn``, e.g.
  zh_CN-huayan-medium) were trained on espeak-ng's IPA for Chinese. We hand
  espeak our corrected pinyin instead of the Hanzi (its own Chinese reading gets
  polyphones wrong): espeak's ``cmn`` reads pinyin with tone digits (``yin2hang2``)
  exactly as it reads an unambiguous Hanzi of that reading (checked in
  tests/test_zh_phonemes.py). Syllables espeak-ng 1.52 cannot read at all —
  ``jiong qiong xiong`` (it falls back to English, for the Hanzi too) and the
  interjections ``m hm hng ê`` — are composed from espeak's own symbols
  (``compose_espeak_syllable``). Note: espeak's IPA prints tones 1 and 4 alike
  (``5``), so these voices cannot tell mā from mà; that is in their training data.
* pinyin-symbol voices (``phoneme_type = "pinyin"``) take initial, final and tone
  symbols, Piper's convention (``piper/phonemize_chinese.py``): ``Ø`` for no
  initial, ``y``/``w`` as initials, ü written ``v`` (``jv``, ``xve``, ``yvan``),
  tones ``1``-``5``; ids from the voice's ``phoneme_id_map`` with padding after
  each syllable and pause (``pinyin_ids``).

Erhua (``wanr2``) becomes the syllable followed by a neutral ``er``: espeak reads
``wan2er5``; pinyin symbols ``w an 2 Ø er 5`` (neither convention has r-finals).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tts_engine.voice import phoneme_ids

#: Longest first: zh ch sh before z c s.
INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
            "c", "s", "y", "w")
ZERO_INITIAL = "Ø"
#: Pause symbols a pinyin voice's table has (Chinese and ASCII forms).
PINYIN_PAUSES = frozenset("。.？?！!—…、，,：:；; ")
#: After these the symbol table pads (end of a syllable or a pause).
GROUP_ENDS = frozenset("12345") | PINYIN_PAUSES
_SYLLABLE = re.compile(r"([a-zü]+?)(r?)([1-5])")
_NO_INITIAL = frozenset({"m", "n", "ng", "hm", "hng", "ê"})  # interjections


def split_syllable(syllable: str) -> tuple[str, str, str, bool]:
    """``"jvan3"``/``"juan3"`` -> (initial, final, tone, erhua); initial "" when none.

    ü is written ``v`` in the final, also after j/q/x/y where pinyin writes ``u``.
    Raises ValueError for text that is not pinyin with a tone digit.
    """
    match = _SYLLABLE.fullmatch(syllable.replace("ü", "v"))
    if match is None:
        raise ValueError(f"not a pinyin syllable with a tone digit: {syllable!r}")
    base, erhua, tone = match.group(1), bool(match.group(2)), match.group(3)
    if base == "e" and erhua:  # "er2" is the syllable er, not erhua of e
        base, erhua = "er", False
    if base in _NO_INITIAL:
        return "", base, tone, erhua
    initial = next((i for i in INITIALS if base.startswith(i) and len(base) > len(i)), "")
    final = base[len(initial):]
    if initial in ("j", "q", "x", "y") and final.startswith("u"):
        final = "v" + final[1:]
    return initial, final, tone, erhua


def pinyin_symbols(syllables: Sequence[str]) -> list[str]:
    """Syllables -> Piper pinyin symbols: initial (or Ø), final, tone; erhua adds Ø er 5."""
    out: list[str] = []
    for syllable in syllables:
        initial, final, tone, erhua = split_syllable(syllable)
        out += [initial or ZERO_INITIAL, final, tone]
        if erhua:
            out += [ZERO_INITIAL, "er", "5"]
    return out


def pinyin_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> tuple[list[int], list[str]]:
    """Piper's pinyin encoding: BOS, each symbol (PAD after a tone or pause), EOS; (ids, skipped)."""
    return phoneme_ids(phonemes, id_map, pad_after=GROUP_ENDS)


# -- espeak-ng cmn -------------------------------------------------------------

#: espeak-ng cmn's tone symbols in its IPA output, by tone (1 and 4 print alike).
ESPEAK_TONES = {"1": "5", "2": "ɜ", "3": "2", "4": "5", "5": "1"}
#: Syllables espeak-ng 1.52 cmn cannot read (it switches to English).
ESPEAK_UNREADABLE = re.compile(r"(?:[jqx]iong|m|hm|hng|ê|wong)[1-5]")
_ESPEAK_INITIALS = {"j": "tɕ", "q": "tɕh", "x": "ɕ", "h": "χ", "": ""}
_ESPEAK_FINALS = {"iong": "ionɡ", "m": "m", "hm": "m", "hng": "ŋ", "ê": "ɛ", "wong": "wuəŋ"}


def espeak_spelling(syllable: str) -> str:
    """How espeak cmn is given one syllable: ``v`` for ü, erhua as a neutral er (``wan2er5``)."""
    initial, final, tone, erhua = split_syllable(syllable)
    if initial in ("j", "q", "x", "y") and final.startswith("v"):
        final = "u" + final[1:]  # espeak reads ju/que/xuan/yun as pinyin writes them
    spelled = initial + final + tone
    return spelled + "er5" if erhua else spelled


def compose_espeak_syllable(syllable: str) -> str:
    """IPA (espeak cmn symbols) for a syllable espeak cannot read: ``xiong2`` -> ``ɕˈionɡɜ``."""
    base, tone = syllable[:-1], syllable[-1]
    if base.endswith("iong"):
        initial, final = _ESPEAK_INITIALS[base[0]], _ESPEAK_FINALS["iong"]
    elif base in ("hm", "hng"):
        initial, final = "χ", _ESPEAK_FINALS[base]
    else:
        initial, final = "", _ESPEAK_FINALS[base]
    return f"{initial}ˈ{final}{ESPEAK_TONES[tone]}"


def third_tone_sandhi(words: Sequence[Sequence[str]]) -> list[list[str]]:
    """Surface tones for a sentence given as syllables per word: a third tone before a third
    tone becomes second (你好 ni3 hao3 -> ni2 hao3).

    Inside a word every third tone of a run but the last changes (展览馆 zhan2 lan2 guan3);
    across words only a one-syllable word changes before a third tone (很好 hen2 hao3), since a
    longer word usually ends a prosodic foot. Neutral tones stop a run.
    """
    out = [list(word) for word in words]
    for word, original in zip(out, words, strict=True):
        for k in range(len(word) - 1):
            if original[k].endswith("3") and original[k + 1].endswith("3"):
                word[k] = word[k][:-1] + "2"
    for left, right, original in zip(out, out[1:], words[1:], strict=False):
        if len(left) == 1 and right and left[0].endswith("3") and original[0].endswith("3"):
            left[0] = left[0][:-1] + "2"
    return out
