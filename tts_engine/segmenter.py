"""Streaming clause segmenter: LLM tokens in, speakable clauses out.

Pure Python, no dependencies, no I/O. The TTS worker speaks each clause as soon
as it is complete, so the first words are heard while the model is still writing.

Rules (English and Chinese):

* Sentence ends: ``. ! ? …`` (also ``...``) and ``。！？``. A run of them
  (``?!``, ``...``, ``……``) is one end; closing quotes/brackets right after it
  stay with the sentence (``"Stop." Then`` -> ``"Stop."`` | ``Then``). ASCII
  ends need whitespace after them (so ``3.14``, ``example.com``, ``a.b@c.d``
  and ``?q=1`` never break); after Chinese text they do not.
* Clause breaks ``, ; :`` and ``，、；：`` only once the clause is long enough:
  ``first_min_chars`` for the first clause of a stream (speech starts sooner),
  ``min_chars`` after it. ASCII ones also need whitespace after them
  (``1,000``, ``12:30``, ``https://``).
* No break after abbreviations (``Mr. Dr. e.g. U.S. etc. a.m.``), initials
  (``J. K.``), a leading list number (``1. ``), or inside quotes/brackets.
* A newline ends a clause.
* ``first_max_words`` (0: off): a first clause with no break within its first that many
  words is cut after them, at a space (speech starts sooner; may be heard as a break). The
  cut moves past a word that leads into the next one (an article, preposition, conjunction:
  ``WORDS_LEADING_ON``), so "The capital of" becomes "The capital of France".
* A clause longer than ``max_chars`` is cut at its last space or between two
  Hanzi (Chinese has no spaces), else at any character.

Lengths are in Latin-character equivalents: one CJK character counts as
``CJK_CHAR_WEIGHT`` (a Hanzi is a whole syllable, spoken about as long as three
Latin letters), so one set of limits suits both languages.

A ``.`` at the end of the text received so far is ambiguous (``3.`` may become
``3.14``) — such a candidate is held until the next character arrives, and no
longer. The result never depends on how the text was split into tokens.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

#: Weight of one CJK character in clause lengths (Latin characters weigh 1).
CJK_CHAR_WEIGHT = 3

_SENTENCE_ENDS = frozenset(".!?…。！？")
_CJK_SENTENCE_ENDS = frozenset("。！？")
_CLAUSE_BREAKS = frozenset(",;:，、；：")
_CJK_CLAUSE_BREAKS = frozenset("，、；：")
_OPENERS = frozenset("([{（【「『《〈“")
_CLOSERS = frozenset(")]}）】」』》〉”")
# Closers allowed right after a sentence end; ’ and ' are apostrophes elsewhere.
_TRAILING_CLOSERS = _CLOSERS | frozenset("’'\"")
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "cf", "approx", "ph.d"}
)
# Dotted initialisms before their final '.': e.g, i.e, U.S, a.m, p.m, U.K.
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
#: Words a first clause cut at ``first_max_words`` never ends with (they lead into the next word).
WORDS_LEADING_ON = frozenset(
    "a an the my your our their his her its this that these those and or but so because if than "
    "to of in on at by for from with about into over as is are was were be am not very "
    "i you we they he she can could would will should may might must do does did have has had".split()
)
_WORD = re.compile(r"\S+")


def is_cjk(char: str) -> bool:
    """True for Han ideographs and other CJK characters (not punctuation)."""
    code = ord(char)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2FA1F
        or 0xF900 <= code <= 0xFAFF
        or 0x3040 <= code <= 0x30FF  # kana
        or 0xAC00 <= code <= 0xD7AF  # hangul
    )


def clause_weight(text: str) -> int:
    """Length of ``text`` in Latin-character equivalents (CJK counts ``CJK_CHAR_WEIGHT``)."""
    return sum(CJK_CHAR_WEIGHT if is_cjk(ch) else 1 for ch in text)


def _has_word(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def _previous_char(text: str, index: int) -> str:
    """The last non-space character before ``index`` ("" if none)."""
    for j in range(index - 1, -1, -1):
        if not text[j].isspace():
            return text[j]
    return ""


class ClauseSegmenter:
    """Splits a stream of LLM tokens into clauses for TTS.

    ``feed`` returns the clauses that became speakable with this token;
    ``flush`` returns the rest at the end of the stream. Clauses are stripped
    and never whitespace-only. Lengths are Latin-character equivalents (see
    ``CJK_CHAR_WEIGHT``).
    """

    def __init__(self, first_min_chars: int = 8, min_chars: int = 40, max_chars: int = 200,
                 first_max_words: int = 0) -> None:
        if not 0 < first_min_chars <= max_chars or not 0 < min_chars <= max_chars:
            raise ValueError(
                "need 0 < first_min_chars <= max_chars and 0 < min_chars <= max_chars, got "
                f"{first_min_chars}, {min_chars}, {max_chars}"
            )
        if first_max_words < 0:
            raise ValueError(f"need first_max_words >= 0 (0: off), got {first_max_words}")
        self.first_min_chars = first_min_chars
        self.first_max_words = first_max_words
        self.min_chars = min_chars
        self.max_chars = max_chars
        self._pending = ""
        self._emitted = 0

    @classmethod
    def from_config(cls, tts_cfg: Any) -> "ClauseSegmenter":
        """Build from a ``base.config.TtsConfig`` (``first_clause_min_chars`` etc.)."""
        return cls(
            first_min_chars=tts_cfg.first_clause_min_chars,
            min_chars=tts_cfg.clause_min_chars,
            max_chars=tts_cfg.clause_max_chars,
            first_max_words=tts_cfg.first_clause_max_words,
        )

    @property
    def pending(self) -> str:
        """Text received but not yet emitted."""
        return self._pending

    def feed(self, token: str) -> list[str]:
        """Add one token; return the clauses completed by it (often none)."""
        self._pending += token
        return self._drain(at_end=False)

    def flush(self) -> list[str]:
        """End of stream: return every remaining clause and start a new stream."""
        clauses = self._drain(at_end=True)
        rest = self._pending.strip()
        if rest:
            clauses.append(rest)
        self.reset()
        return clauses

    def reset(self) -> None:
        """Drop pending text (e.g. on barge-in); the next clause is a first clause again."""
        self._pending = ""
        self._emitted = 0

    # -- internals -------------------------------------------------------

    def _drain(self, at_end: bool) -> list[str]:
        clauses: list[str] = []
        while True:
            self._pending = self._pending.lstrip()
            cut = self._find_break(self._pending, at_end)
            if self._emitted == 0 and self.first_max_words:
                words = self._words_cut(self._pending)
                if words is not None and (cut is None or words < cut):
                    cut = words
            if cut is not None and clause_weight(self._pending[:cut].rstrip()) > self.max_chars:
                cut = None  # the forced cut below comes first
            if cut is None and clause_weight(self._pending.rstrip()) > self.max_chars:
                cut = self._forced_cut(self._pending)
            if cut is None:
                return clauses
            clause = self._pending[:cut].strip()
            self._pending = self._pending[cut:]
            if clause:
                clauses.append(clause)
                self._emitted += 1

    def _words_cut(self, text: str) -> int | None:
        """End of the first clause's ``first_max_words``-th word (or a later one that does not lead
        on), once a space follows it; None before that."""
        for count, match in enumerate(_WORD.finditer(text), start=1):
            if match.end() == len(text):
                return None  # the word may go on
            word = re.sub(r"[^\w']", "", match.group().lower())
            if count >= self.first_max_words and word not in WORDS_LEADING_ON:
                return match.end()
        return None

    def _min_chars(self) -> int:
        return self.first_min_chars if self._emitted == 0 else self.min_chars

    def _find_break(self, text: str, at_end: bool) -> int | None:
        """Index just after the first clause end in ``text``; None if none is known yet."""
        depth = 0  # open brackets and curly/CJK quotes
        in_quote = False  # inside ASCII "…"
        i, n = 0, len(text)
        while i < n:
            char = text[i]
            if char in _SENTENCE_ENDS:
                end = i
                while end < n and text[end] in _SENTENCE_ENDS:
                    end += 1
                after, depth, in_quote = _absorb_closers(text, end, depth, in_quote)
                if after == n and not at_end:
                    return None  # the next character decides
                if depth == 0 and not in_quote and self._is_sentence_end(text, i, end, after):
                    return after
                i = after
                continue
            if char in _CLAUSE_BREAKS:
                if i + 1 == n and not at_end and char not in _CJK_CLAUSE_BREAKS:
                    return None
                if depth == 0 and not in_quote and self._is_clause_break(text, i):
                    return i + 1
            elif char == "\n" and _has_word(text[:i]):
                return i + 1
            elif char in _OPENERS:
                depth += 1
            elif char in _CLOSERS:
                depth = max(0, depth - 1)
            elif char == '"':
                in_quote = not in_quote
            i += 1
        return None

    def _is_sentence_end(self, text: str, start: int, end: int, after: int) -> bool:
        """Whether the run ``text[start:end]`` of sentence-end marks (closers up to ``after``) ends a sentence."""
        if not _has_word(text[:start]):
            return False  # a bare "..." or "?!" joins the next clause
        run = text[start:end]
        following = text[after] if after < len(text) else " "
        chinese = any(ch in _CJK_SENTENCE_ENDS for ch in run) or is_cjk(_previous_char(text, start))
        if not chinese and not (following.isspace() or is_cjk(following)):
            return False
        if run == ".":
            return not _is_abbreviation(text, start)
        return True

    def _is_clause_break(self, text: str, index: int) -> bool:
        """Whether the comma/colon/semicolon at ``index`` may end a clause here."""
        char = text[index]
        if char not in _CJK_CLAUSE_BREAKS and not is_cjk(_previous_char(text, index)):
            following = text[index + 1] if index + 1 < len(text) else " "
            if not following.isspace():
                return False
        return _has_word(text[:index]) and clause_weight(text[: index + 1].strip()) >= self._min_chars()

    def _forced_cut(self, text: str) -> int:
        """Where to cut ``text`` (longer than ``max_chars``).

        At the last space or Hanzi boundary that fits, else after the last character that fits.
        """
        weight, last_fit, last_soft = 0, 0, 0
        for i, char in enumerate(text):
            if _is_soft_cut(text, i):
                last_soft = i
            weight += CJK_CHAR_WEIGHT if is_cjk(char) else 1
            if weight > self.max_chars:
                break
            last_fit = i + 1
        return last_soft or max(last_fit, 1)


def _is_soft_cut(text: str, index: int) -> bool:
    """A space, or a point between two CJK characters (or after CJK punctuation, before one)."""
    if index == 0:
        return False
    char, prev = text[index], text[index - 1]
    if char.isspace():
        return True
    return is_cjk(char) and (is_cjk(prev) or prev in _CJK_SENTENCE_ENDS or prev in _CJK_CLAUSE_BREAKS)


def _absorb_closers(text: str, index: int, depth: int, in_quote: bool) -> tuple[int, int, bool]:
    """Step over closing quotes/brackets at ``index``; returns (new index, depth, in_quote)."""
    n = len(text)
    while index < n and text[index] in _TRAILING_CLOSERS:
        char = text[index]
        if char == '"':
            if not in_quote:
                break  # an opening quote belongs to the next sentence
            in_quote = False
        elif char in _CLOSERS:
            depth = max(0, depth - 1)
        index += 1
    return index, depth, in_quote


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the '.' at ``dot`` closes an abbreviation, an initial or a leading list number."""
    start = dot
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _OPENERS and text[start - 1] != '"':
        start -= 1
    word = unicodedata.normalize("NFKC", text[start:dot])
    if word.lower() in _ABBREVIATIONS or _INITIALISM.fullmatch(word):
        return True
    if len(word) == 1 and word.isupper():
        return True  # an initial: "J. K. Rowling"
    return word.isdigit() and not text[:start].strip()  # "1. First item"
