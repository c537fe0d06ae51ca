"""espeak-ng phonemes, exactly as Piper 1.8 makes them (``piper/phonemize_espeak.py``).

espeak-ng comes from the copy bundled in piper-tts (``piper/espeakbridge*.so`` +
``piper/espeak-ng-data``), loaded by file so that importing this module does not import
``piper`` (which imports onnxruntime).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import threading
import unicodedata
from pathlib import Path
from types import ModuleType

from tts_engine.voice import VoiceConfig
from base.errors import ModelError

# espeak-ng is one global C state (voice, buffers): every call goes through this lock.
# (piper.voice has its own lock; do not phonemize with PiperVoice concurrently in one process.)
_ESPEAK_LOCK = threading.Lock()
_espeak: ModuleType | None = None
#: The voice espeak-ng was last set to (``set_voice`` costs ~0.13 ms, a third of a short
#: sentence's phonemization; phonemes identical to setting it every time: tests/test_tts_frontend.py).
_voice: str | None = None


def piper_package_dir() -> Path:
    """piper-tts's package directory, found without importing it."""
    spec = importlib.util.find_spec("piper")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("piper-tts is not installed; it provides espeak-ng (`pip install piper-tts==1.8.0`)")
    return Path(next(iter(spec.submodule_search_locations)))


def _load_espeakbridge() -> ModuleType:
    """Load and initialize ``piper.espeakbridge`` once (call with ``_ESPEAK_LOCK`` held)."""
    global _espeak
    if _espeak is None:
        pkg = piper_package_dir()
        found = sorted(pkg.glob("espeakbridge*.so")) + sorted(pkg.glob("espeakbridge*.pyd"))
        if not found:
            raise ModelError(f"piper-tts at {pkg} has no espeakbridge extension")
        loader = importlib.machinery.ExtensionFileLoader("piper.espeakbridge", str(found[0]))
        spec = importlib.util.spec_from_file_location("piper.espeakbridge", found[0], loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        module.initialize(str(pkg / "espeak-ng-data"))
        _espeak = module
    return _espeak


def bridge_for(voice: str) -> ModuleType:
    """The espeak-ng bridge set to ``voice`` (call with ``_ESPEAK_LOCK`` held). Everything in this
    process that phonemizes with the bridge must come through here: the voice is set only when it
    changes. (piper-tts's ``PiperVoice`` sets its own voice on every call; after it, this module's
    next call may still believe its last voice is set: use one voice per process with both.)"""
    global _voice
    bridge = _load_espeakbridge()
    if _voice != voice:
        _voice = None  # unknown if set_voice raises
        bridge.set_voice(voice)
        _voice = voice
    return bridge


class EspeakPhonemizer:
    """espeak-ng phonemes grouped by sentence, exactly as ``piper/phonemize_espeak.py``."""

    def __init__(self, voice: str, vowel_clusters: frozenset[tuple[str, ...]] = frozenset()) -> None:
        self.voice = voice
        self.vowel_clusters = vowel_clusters

    @classmethod
    def for_voice(cls, config: VoiceConfig) -> EspeakPhonemizer:
        return cls(config.espeak_voice, config.vowel_clusters)

    def phonemize(self, text: str) -> list[list[str]]:
        text = text.replace("\x00", " ")  # the C bridge rejects NUL
        with _ESPEAK_LOCK:
            clauses = bridge_for(self.voice).get_phonemes(text)
        sentences: list[list[str]] = []
        current: list[str] = []
        for phonemes, terminator, end_of_sentence in clauses:
            phonemes = re.sub(r"\([^)]+\)", "", phonemes) + terminator  # drop (lang) switch flags
            if terminator in (",", ":", ";"):
                phonemes += " "
            current.extend(unicodedata.normalize("NFD", phonemes))
            if end_of_sentence:
                sentences.append(self._merge_clusters(current))
                current = []
        if current:
            sentences.append(self._merge_clusters(current))
        return sentences

    def _merge_clusters(self, phonemes: list[str]) -> list[str]:
        if not self.vowel_clusters:
            return phonemes
        longest = max(len(c) for c in self.vowel_clusters)
        out: list[str] = []
        i = 0
        while i < len(phonemes):
            for n in range(min(longest, len(phonemes) - i), 1, -1):
                if tuple(phonemes[i : i + n]) in self.vowel_clusters:
                    out.append("".join(phonemes[i : i + n]))
                    i += n
                    break
            else:
                out.append(phonemes[i])
                i += 1
        return out
