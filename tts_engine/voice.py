"""A Piper voice: its JSON config (``VoiceConfig``) and where its weights are (``Voice``).

Backend-neutral on purpose: no onnxruntime or torch here. The CPU backend
(``tts_engine.onnx_backend``) and the GPU backend (``tts_engine.torch_vits``) both
take a ``Voice`` and load ``voice.model_path`` their own way.

The config format is Piper's ``<voice>.onnx.json`` (see ``piper/config.py``);
defaults match Piper's when a key is absent.
"""

from __future__ import annotations

import json
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.errors import InvalidInput, ModelError

DEFAULT_NOISE_SCALE = 0.667
DEFAULT_LENGTH_SCALE = 1.0
DEFAULT_NOISE_W = 0.8
DEFAULT_HOP_LENGTH = 256
#: Phoneme types a Piper voice may declare (``phoneme_type`` in its JSON).
PHONEME_TYPES = ("espeak", "text", "pinyin", "hebrew", "japanese", "thai")
#: Special symbols of the id map: padding, beginning and end of sentence.
PAD, BOS, EOS = "_", "^", "$"


def phoneme_ids(
    phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]], pad_after: Container[str] | None = None
) -> tuple[list[int], list[str]]:
    """Piper's id layout: BOS, each phoneme's ids, EOS; (ids, phonemes ``id_map`` lacks, skipped).

    PAD follows BOS and every phoneme when ``pad_after`` is None (espeak and text voices), else
    only the phonemes in ``pad_after`` (pinyin voices: each tone and pause).
    """
    pad = id_map[PAD]
    ids = [*id_map[BOS], *(pad if pad_after is None else ())]
    skipped = []
    for phoneme in phonemes:
        ids_of = id_map.get(phoneme)
        if ids_of is None:
            skipped.append(phoneme)
            continue
        ids.extend(ids_of)
        if pad_after is None or phoneme in pad_after:
            ids.extend(pad)
    ids.extend(id_map[EOS])
    return ids, skipped


@dataclass(frozen=True)
class VoiceConfig:
    """What a backend and a text front end need to know about one voice."""

    #: Output rate of the model, Hz.
    sample_rate: int
    #: espeak-ng voice name (e.g. "en-us"); for non-espeak voices the language/alphabet tag.
    espeak_voice: str
    #: How text becomes phonemes: one of ``PHONEME_TYPES``.
    phoneme_type: str
    #: Phoneme (one or more code points) -> model input ids.
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    #: Phoneme -> replacement phonemes applied after phonemization, as piper-phonemize did
    #: (Piper 1.8's Python code ignores it); empty for every current Piper voice.
    phoneme_map: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Noise scale (prior variance) default; 0 is deterministic.
    noise_scale: float = DEFAULT_NOISE_SCALE
    #: Length scale default; >1 speaks slower.
    length_scale: float = DEFAULT_LENGTH_SCALE
    #: Duration-predictor noise default; 0 is deterministic.
    noise_w: float = DEFAULT_NOISE_W
    #: Speakers in the model; >1 means the model takes a ``sid`` input.
    num_speakers: int = 1
    #: Speaker name -> speaker id.
    speaker_id_map: Mapping[str, int] = field(default_factory=dict)
    #: Speaker used when a request names none (multi-speaker voices).
    default_speaker_id: int = 0
    #: Size of the model's symbol table; every id must be below it.
    num_symbols: int = 256
    #: Audio samples per latent frame.
    hop_length: int = DEFAULT_HOP_LENGTH
    #: Vowel sequences merged into one phoneme (e.g. ("a", "ɪ") -> "aɪ"); empty for none.
    vowel_clusters: frozenset[tuple[str, ...]] = frozenset()
    #: Language code from the voice's ``language.code`` (e.g. "en_US"); "" when absent.
    language_code: str = ""

    @property
    def language(self) -> str:
        """Language family, lowercase (e.g. "en", "zh"), from the language code or espeak voice."""
        tag = self.language_code or self.espeak_voice
        return tag.replace("_", "-").split("-")[0].lower()

    @staticmethod
    def from_dict(data: Mapping[str, Any], source: str = "voice config") -> VoiceConfig:
        """Build from the parsed JSON; ``source`` names the file in error messages.

        Raises ModelError when a required key is missing or has the wrong shape.
        """
        try:
            return _from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ModelError(f"{source}: not a valid Piper voice config ({detail})") from None

    @staticmethod
    def load(path: str | Path) -> VoiceConfig:
        """Read a ``<voice>.onnx.json`` file; ModelError names the file when it is missing or bad."""
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"voice config {p} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelError(f"voice config {p} cannot be read: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ModelError(f"voice config {p} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ModelError(f"voice config {p}: expected a JSON object, got {type(data).__name__}")
        return VoiceConfig.from_dict(data, source=str(p))


def _from_dict(data: Mapping[str, Any]) -> VoiceConfig:
    inference = data.get("inference") or {}
    id_map = {str(k): tuple(int(i) for i in v) for k, v in data["phoneme_id_map"].items()}
    for symbol in (PAD, BOS, EOS):
        if symbol not in id_map:
            raise ValueError(f"phoneme_id_map lacks the special symbol {symbol!r}")
    phoneme_type = str(data.get("phoneme_type", "espeak"))
    if phoneme_type not in PHONEME_TYPES:
        raise ValueError(f"unknown phoneme_type {phoneme_type!r}")
    phoneme_map = {str(k): tuple(str(p) for p in v) for k, v in (data.get("phoneme_map") or {}).items()}
    max_id = max((i for ids in id_map.values() for i in ids), default=0)
    return VoiceConfig(
        sample_rate=int(data["audio"]["sample_rate"]),
        espeak_voice=str(data["espeak"]["voice"]),
        phoneme_type=phoneme_type,
        phoneme_id_map=id_map,
        phoneme_map=phoneme_map,
        noise_scale=float(inference.get("noise_scale", DEFAULT_NOISE_SCALE)),
        length_scale=float(inference.get("length_scale", DEFAULT_LENGTH_SCALE)),
        noise_w=float(inference.get("noise_w", DEFAULT_NOISE_W)),
        num_speakers=int(data.get("num_speakers", 1)),
        speaker_id_map={str(k): int(v) for k, v in (data.get("speaker_id_map") or {}).items()},
        default_speaker_id=int(data.get("default_speaker_id", 0)),
        num_symbols=int(data.get("num_symbols", max_id + 1)),
        hop_length=int(data.get("hop_length", DEFAULT_HOP_LENGTH)),
        vowel_clusters=frozenset(tuple(str(p) for p in c) for c in data.get("vowel_clusters") or ()),
        language_code=str((data.get("language") or {}).get("code", "")),
    )


@dataclass(frozen=True)
class Voice:
    """A Piper voice on disk: the weights file plus its parsed config."""

    #: The ``.onnx`` weights file (loaded by a backend, not here).
    model_path: Path
    #: The parsed ``.onnx.json``.
    config: VoiceConfig
    #: Where ``config`` was read from.
    config_path: Path

    @property
    def sample_rate(self) -> int:
        """Native output rate, Hz."""
        return self.config.sample_rate

    @staticmethod
    def load(onnx_path: str | Path, config_path: str | Path | None = None) -> Voice:
        """Locate the weights and parse the config (default ``<onnx_path>.json``).

        Raises ModelError naming the file when either is missing, empty or unreadable.
        A truncated ``.onnx`` is detected when a backend loads it.
        """
        model = Path(onnx_path).expanduser()
        if not model.is_file():
            raise ModelError(f"voice model {model} does not exist")
        if model.stat().st_size == 0:
            raise ModelError(f"voice model {model} is empty")
        cfg_path = Path(config_path).expanduser() if config_path else model.with_name(model.name + ".json")
        return Voice(model_path=model, config=VoiceConfig.load(cfg_path), config_path=cfg_path)

    def speaker_id(self, requested: int | None) -> int | None:
        """The ``sid`` to feed the model: None for single-speaker voices, else ``requested`` or the default.

        Raises InvalidInput when ``requested`` is outside the voice's speakers.
        """
        if self.config.num_speakers <= 1:
            if requested not in (None, 0):
                raise InvalidInput(f"voice {self.model_path.name} has one speaker; speaker {requested} does not exist")
            return None
        sid = self.config.default_speaker_id if requested is None else requested
        if not 0 <= sid < self.config.num_speakers:
            raise InvalidInput(
                f"speaker {sid} out of range: voice {self.model_path.name} has {self.config.num_speakers} speakers"
            )
        return sid
