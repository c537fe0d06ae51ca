"""Round trip: our TTS speaks English sentences, whisper base transcribes them, WER <= 10 %."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tts_engine.cpu_engine import OnnxTtsEngine
from tts_engine.engine import SynthesisOptions

pytestmark = pytest.mark.slow

# Numbers are written as words so the reference needs no number normalization.
SENTENCES = [
    "The weather today is sunny with a light breeze from the west.",
    "Please remind me to call my sister at seven tonight.",
    "How many people live in the capital city of France?",
    "My favorite breakfast is toast with butter and a cup of coffee.",
    "Turn left at the next corner and keep going for two miles.",
    "The library closes early on Sundays, so bring the books back tomorrow.",
    "Can you play some quiet music while I read?",
    "Our train leaves the station at half past nine in the morning.",
    "She planted tomatoes, carrots and beans in the garden last spring.",
    "Water boils at one hundred degrees at sea level.",
    "I would like to book a table for four people on Friday evening.",
    "The children laughed when the little dog chased its own tail.",
]


def normalize(text: str) -> str:
    """Lowercase, punctuation stripped, hyphens as spaces, whitespace collapsed."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^\w\s']", " ", text)
    return " ".join(text.split())


@pytest.fixture(scope="module")
def whisper(cfg):
    from faster_whisper import WhisperModel

    from base import models

    return WhisperModel(str(models.resolve_asr(cfg).path), device="cpu", compute_type="int8")


def test_whisper_understands_our_speech(cfg, whisper):
    import jiwer

    engine = OnnxTtsEngine.from_config(cfg)
    options = SynthesisOptions(sample_rate=16000)
    references, hypotheses = [], []
    for sentence in SENTENCES:
        chunks = list(engine.synthesize(sentence, options))
        audio = np.concatenate([c.pcm for c in chunks]).astype(np.float32) / 32768.0
        segments, _info = whisper.transcribe(audio, language="en", beam_size=1, vad_filter=False)
        references.append(normalize(sentence))
        hypotheses.append(normalize(" ".join(s.text for s in segments)))
    wer = jiwer.wer(references, hypotheses)
    report = "\n".join(f"  ref: {r}\n  hyp: {h}" for r, h in zip(references, hypotheses, strict=True))
    assert wer <= 0.10, f"WER {wer:.3f} > 0.10\n{report}"
