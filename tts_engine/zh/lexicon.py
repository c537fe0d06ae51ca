"""Pronunciation lexicon: word -> pinyin syllables, ours plus the user's.

Files are TSV (``word<TAB>pin1 yin1``, ``#`` comments) or TOML (a ``[words]``
table, ``"银行" = "yin2 hang2"``). Syllables are lowercase pinyin with a tone digit
1-5 (5 = neutral), ``v`` for ü; one per Hanzi, except that an erhua syllable
(``dianr3``) also covers the 儿 after its Hanzi. Later files override earlier ones.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from base.errors import ConfigError

#: The lexicon shipped with voxloop.
BUILTIN_LEXICON = Path(__file__).with_name("lexicon.tsv")
SYLLABLE = re.compile(r"[a-z]+[1-5]")


def is_erhua(syllable: str) -> bool:
    """``dianr3`` is erhua; ``er2`` is the plain syllable 儿/二."""
    return syllable[:-1].endswith("r") and syllable[:-1] != "er"


def check_entry(word: str, syllables: list[str], source: str) -> None:
    """Raise ConfigError unless ``syllables`` spell ``word`` (one per Hanzi, erhua covering 儿)."""
    bad = [s for s in syllables if not SYLLABLE.fullmatch(s)]
    if bad:
        raise ConfigError(f"{source}: {word!r}: {bad[0]!r} is not pinyin with a tone digit 1-5 (e.g. hang2)")
    covered = sum(2 if is_erhua(s) else 1 for s in syllables)
    if covered != len(word):
        raise ConfigError(f"{source}: {word!r} has {len(word)} characters but {len(syllables)} syllables")


class Lexicon(Mapping[str, tuple[str, ...]]):
    """Word -> syllables; ``max_word_len`` bounds lookups."""

    def __init__(self, entries: Mapping[str, Iterable[str]] | None = None) -> None:
        self._entries: dict[str, tuple[str, ...]] = {}
        for word, syllables in (entries or {}).items():
            self.add(word, list(syllables))

    def add(self, word: str, syllables: list[str], source: str = "lexicon") -> None:
        check_entry(word, syllables, source)
        self._entries[word] = tuple(syllables)

    @property
    def max_word_len(self) -> int:
        return max((len(w) for w in self._entries), default=0)

    def __getitem__(self, word: str) -> tuple[str, ...]:
        return self._entries[word]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, *paths: str | Path | None) -> "Lexicon":
        """The built-in lexicon, then each of ``paths`` (None skipped) overriding it."""
        lexicon = cls()
        for path in (BUILTIN_LEXICON, *paths):
            if path is not None:
                lexicon.update_from_file(Path(path).expanduser())
        return lexicon

    def update_from_file(self, path: Path) -> None:
        """Add a TSV or TOML file's entries (ConfigError names the file and line when malformed)."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"Chinese lexicon {path} cannot be read: {exc}") from None
        if path.suffix.lower() == ".toml":
            try:
                words = tomllib.loads(text).get("words", {})
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"Chinese lexicon {path}: {exc}") from None
            for word, pinyin in words.items():
                self.add(word, str(pinyin).split(), f"{path} [words]")
            return
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            word, tab, pinyin = line.partition("\t")
            if not tab:
                raise ConfigError(f"{path}:{number}: expected 'word<TAB>pinyin', got {line!r}")
            self.add(word.strip(), pinyin.split(), f"{path}:{number}")
