"""The voices a server offers (``"default"`` and ``tts.voices``) and the speech stage each speaks on.

A voice of the server's own file is the default voice's engine with other settings (speaker,
scales): no memory of its own. A voice of another file gets its own onnxruntime engine on the CPU,
loaded at start, with ``tts.onnx_workers`` sessions: also on a GPU server, whose engine speaks the
default voice only (one set of CUDA graphs; docs/deploy.md says what that costs).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipeline.speech import SpeechStage, ThreadedSpeech
from pipeline.workers import ModelWorker
from tts_engine.engine import SynthesisOptions
from base.config import DEFAULT_VOICE, Config, VoiceSpec

log = logging.getLogger(__name__)

#: Fields of ``SynthesisOptions`` a voice sets (the request's own values win over them).
_VOICE_FIELDS = ("speaker_id", "length_scale", "noise_scale", "noise_w")


@dataclass(frozen=True)
class Voice:
    """A voice clients choose by name: where it is spoken and with what settings."""

    name: str
    speech: SpeechStage
    #: The voice's speaker and scales (None: the engine's defaults).
    options: SynthesisOptions = SynthesisOptions()
    #: Its own engine's worker (a voice of another file), else None.
    worker: ModelWorker | None = None

    def request(self, options: SynthesisOptions) -> SynthesisOptions:
        """``options`` with this voice's speaker and scales where ``options`` names none."""
        own = {f: getattr(self.options, f) for f in _VOICE_FIELDS
               if getattr(options, f) is None and getattr(self.options, f) is not None}
        return dataclasses.replace(options, **own) if own else options


def spec_options(spec: VoiceSpec) -> SynthesisOptions:
    return SynthesisOptions(**{f: getattr(spec, f) for f in _VOICE_FIELDS})


def load_voices(cfg: Config, default: SpeechStage) -> dict[str, Voice]:
    """Every voice by name: ``"default"`` on ``default``, the others of ``cfg.tts.voices`` (engines of
    other files loaded and warmed up here, seconds each)."""
    from base.models import resolve_voice

    own = Path(resolve_voice(cfg).path).resolve()
    voices = {DEFAULT_VOICE: Voice(DEFAULT_VOICE, default)}
    for spec in cfg.tts.voices:
        if spec.path is None or Path(spec.path).resolve() == own:
            voices[spec.name] = Voice(spec.name, default, spec_options(spec))
            continue
        t0 = time.monotonic()
        worker = ModelWorker(f"tts-{spec.name}", cpu_engines(cfg, spec.path), queue_size=cfg.tts.queue_size)
        voices[spec.name] = Voice(spec.name, ThreadedSpeech(worker), spec_options(spec), worker)
        log.info("voice %r (%s) loaded on the CPU in %.1f s", spec.name, spec.path, time.monotonic() - t0)
    return voices


def cpu_engines(cfg: Config, path: str) -> list[Any]:
    """onnxruntime engines of the voice file ``path`` (whole sentences), one per ``tts.onnx_workers``."""
    from tts_engine.factory import create_engines

    tts = dataclasses.replace(cfg.tts, voice_path=path, voice_config_path=None, backend="onnx",
                              streaming=False, stream_first_clause=False)
    engines = create_engines(dataclasses.replace(cfg, tts=tts))
    for _ in engines[0].synthesize("Warm up."):
        pass
    return engines


class VoicesCollector(Collector):
    """``voxloop_tts_voice{voice, device, own_engine} 1`` for each voice (``/metrics``): where it is
    spoken (``gpu``: the GPU engine's default voice; ``cpu``) and whether it has an engine of its own."""

    def __init__(self, voices: Callable[[], dict[str, Voice]], default_device: str) -> None:
        """``default_device``: where the default voice's engine runs (``"gpu"`` or ``"cpu"``)."""
        self.voices = voices
        self.default_device = default_device

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("voxloop_tts_voice", "Voices clients may choose (1 each): the device that "
                                   "speaks it, and whether it has an engine of its own (another voice file)",
                                   labels=["voice", "device", "own_engine"])
        for name, voice in self.voices().items():
            own = voice.worker is not None
            family.add_metric([name, "cpu" if own else self.default_device, str(own).lower()], 1)
        yield family
