"""Accuracy of a grapheme-to-pinyin function on a hand-labelled test set.

The set is a TSV of ``sentence<TAB>expected pinyin`` (``#`` comments), e.g.
``tests/data/zh_polyphones.tsv``. Syllables are compared position by position
after aligning the two sequences (so one missing syllable costs one error, not
the rest of the sentence).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Case:
    sentence: str
    expected: tuple[str, ...]
    #: The section header above it (``# -- name: ...`` -> "name"); "" before any.
    section: str = ""


@dataclass
class Score:
    """Syllable and sentence accuracy (fractions 0..1) and the failing cases."""

    sentences: int = 0
    sentences_right: int = 0
    syllables: int = 0
    syllable_errors: int = 0
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def sentence_accuracy(self) -> float:
        return self.sentences_right / self.sentences if self.sentences else 0.0

    @property
    def syllable_accuracy(self) -> float:
        return 1 - self.syllable_errors / self.syllables if self.syllables else 0.0

    def as_dict(self) -> dict:
        return {
            "sentences": self.sentences,
            "sentence_accuracy": round(self.sentence_accuracy, 4),
            "syllables": self.syllables,
            "syllable_accuracy": round(self.syllable_accuracy, 4),
            "failures": [{"sentence": s, "expected": e, "got": g} for s, e, g in self.failures],
        }


def load_cases(path: str | Path) -> list[Case]:
    """Cases of a TSV test set; ``# -- name: ...`` lines start a section."""
    cases = []
    section = ""
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("# -- "):
            section = line[5:].split(":")[0].strip()
        if not line.strip() or line.startswith("#"):
            continue
        sentence, tab, expected = line.partition("\t")
        if not tab or not expected.split():
            raise ValueError(f"{path}:{number}: expected 'sentence<TAB>pinyin'")
        cases.append(Case(sentence, tuple(expected.split()), section))
    return cases


def syllable_errors(expected: tuple[str, ...], got: list[str]) -> int:
    """Substitutions + insertions + deletions after alignment (edit distance over syllables)."""
    matcher = difflib.SequenceMatcher(a=expected, b=got, autojunk=False)
    errors = 0
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag != "equal":
            errors += max(a1 - a0, b1 - b0)
    return errors


def score(cases: list[Case], predict: Callable[[str], list[str]]) -> Score:
    """Run ``predict(sentence) -> syllables`` over ``cases``."""
    result = Score()
    for case in cases:
        got = predict(case.sentence)
        errors = syllable_errors(case.expected, got)
        result.sentences += 1
        result.syllables += len(case.expected)
        result.syllable_errors += errors
        if errors == 0:
            result.sentences_right += 1
        else:
            result.failures.append((case.sentence, " ".join(case.expected), " ".join(got)))
    return result
