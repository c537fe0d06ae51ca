"""TextFrontend: normalize / phonemize / phonemes_to_ids, ids exactly equal to Piper's."""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest

from tts_engine import frontend as fe
from tts_engine.frontend import PhonemeScheme, TextFrontend, register_phoneme_type
from tts_engine.voice import Voice, VoiceConfig
from base.errors import InvalidInput, ModelError

# Varied on purpose: numbers, abbreviations, clause punctuation (, : ;), quotes,
# contractions, hyphens, accents, parentheses, several sentences, no final stop.
SENTENCES = [
    "Hello, world. How are you? Fine!",
    "Dr. Smith lives at 221 Baker Street; he moved there in 1881.",
    "The meeting starts at 10:30 a.m., doesn't it?",
    "She said: \"I'll be there in twenty-five minutes.\"",
    "A naïve café owner sold crème brûlée (and coffee) for $4.50",
    "Wait... what? No way!",
    "It's 3.14 percent, not 314; read it again",
    "Well-known state-of-the-art systems, e.g. this one, work.",
    "Why?! Because I said so.",
    "The quick brown fox jumps over the lazy dog",
]


@pytest.fixture(scope="module")
def voice_config(cfg) -> VoiceConfig:
    from base import models

    path = models.resolve_voice(cfg).path
    return VoiceConfig.load(models.voice_config_path(cfg, path))


@pytest.fixture(scope="module")
def frontend(voice_config) -> TextFrontend:
    return TextFrontend(voice_config, max_text_chars=20_000)


@pytest.fixture(scope="module")
def piper_voice(cfg):
    """Piper's own PiperVoice as the reference (no ONNX session needed for phonemization)."""
    import json

    from piper.config import PiperConfig
    from piper.voice import PiperVoice

    from base import models

    path = models.resolve_voice(cfg).path
    config = json.loads(models.voice_config_path(cfg, path).read_text())
    return PiperVoice(session=None, config=PiperConfig.from_dict(config))


@pytest.mark.parametrize("text", SENTENCES)
def test_ids_equal_piper(frontend, piper_voice, text):
    ours = [frontend.phonemes_to_ids(s) for s in frontend.phonemize(text)]
    theirs = [piper_voice.phonemes_to_ids(s) for s in piper_voice.phonemize(text)]
    assert ours == theirs
    assert ours and all(ids[0] == 1 and ids[-1] == 2 for ids in ours)


def test_espeak_voice_is_set_once_and_again_after_another_voice(frontend, monkeypatch):
    """espeak-ng's voice is set only when it changes (``bridge_for``): the same phonemes as when set
    before every call, also right after another voice (Mandarin) phonemized in between."""
    from tts_engine import espeak

    fresh = []
    for text in SENTENCES:
        espeak._voice = None  # forces set_voice, as before every call
        fresh.append(frontend.phonemize(text))
    with espeak._ESPEAK_LOCK:
        bridge = espeak._load_espeakbridge()
    calls = []
    monkeypatch.setattr(bridge, "set_voice", lambda v, real=bridge.set_voice: (calls.append(v), real(v))[1])
    cached = [frontend.phonemize(text) for text in SENTENCES]
    mandarin = espeak.EspeakPhonemizer("cmn").phonemize("ni3 hao3")
    again = [frontend.phonemize(text) for text in SENTENCES]
    assert cached == fresh and again == fresh
    assert mandarin and mandarin != frontend.phonemize("ni3 hao3")
    assert calls == ["cmn", frontend.config.espeak_voice]


def test_sentences_split_like_piper(frontend):
    sentences = frontend.phonemize("Hello, world. How are you? Fine!")
    assert len(sentences) == 3
    assert "".join(sentences[0]).endswith(".") and "," in sentences[0]


def test_frontend_does_not_import_onnxruntime():
    import subprocess

    code = (
        "import sys; import tts_engine.frontend as f, tts_engine.voice;"
        "from tts_engine.voice import VoiceConfig;"
        "f.EspeakPhonemizer('en-us').phonemize('hi');"
        "print('onnxruntime' in sys.modules or 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_phonemes_to_ids_layout(frontend, voice_config):
    id_map = voice_config.phoneme_id_map
    ids = frontend.phonemes_to_ids(["h", "ə"])
    assert ids == [*id_map["^"], *id_map["_"], *id_map["h"], *id_map["_"], *id_map["ə"], *id_map["_"], *id_map["$"]]


def test_unknown_phonemes_skipped_and_counted(voice_config, caplog):
    frontend = TextFrontend(voice_config)
    with caplog.at_level(logging.WARNING, logger="tts_engine.frontend"):
        ids = frontend.phonemes_to_ids(["h", "☃", "ə", "☃"])
    assert ids == frontend.phonemes_to_ids(["h", "ə"])
    assert frontend.unknown_phonemes["☃"] == 2
    assert "☃" in caplog.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Tom   &  Jerry\n\tgo  ", "Tom and Jerry go"),
        ("50% off", "50 percent off"),
        ("It costs $20.50, or $1.", "It costs 20 dollars 50 cents, or 1 dollar."),
        ("$3 million", "3 million dollars"),
        ("only $0.99", "only 99 cents"),
        ("£5 and €2.01", "5 pounds and 2 euros 1 cent"),
        ("It is 25°C", "It is 25 degrees Celsius"),
        ("We are #1", "We are number 1"),
        ("cafe\u0301", "caf\u00e9"),  # NFC
        ("Hi 😀 there ❤️ 1️⃣", "Hi there 1"),
        ("bell\x07\x00ring\u200b!", "bell ring !"),
    ],
)
def test_normalize(frontend, text, expected):
    assert frontend.normalize(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "?!...", "😀😀", "\x00\x01\x02", "— – …"])
def test_nothing_speakable_gives_no_sentences(frontend, text):
    assert list(frontend.sentence_ids(text)) == []


def test_emoji_and_control_chars_are_dropped(frontend):
    clean = list(frontend.sentence_ids("Good\x07 morning 😀 everyone\x1b."))
    plain = list(frontend.sentence_ids("Good morning everyone."))
    assert clean == plain


def test_nul_in_phonemize_does_not_crash(frontend):
    assert frontend.phonemize("a\x00b") == frontend.phonemize("a b")


def test_long_text_is_split_into_bounded_sentences(frontend):
    sentence = "The quick brown fox jumps over the lazy dog near the river bank. "
    text = (sentence * 400)[:20_000]
    sentences = list(frontend.sentence_ids(text))
    assert len(sentences) >= 300
    # Each id sequence: BOS, PAD, then phoneme+PAD pairs, EOS.
    assert max(len(ids) for ids in sentences) <= 2 * fe.MAX_SENTENCE_PHONEMES + 3


def test_long_sentence_without_stops_is_cut_at_word_boundaries(frontend, voice_config):
    text = "and the dog ran " * 1000  # 16 000 chars, no sentence terminator
    phonemes = frontend.phonemize(text)
    assert len(phonemes) == 1 and len(phonemes[0]) > 10 * fe.MAX_SENTENCE_PHONEMES
    sentences = list(frontend.sentence_ids(text))
    assert len(sentences) > 10
    space = voice_config.phoneme_id_map[" "][0]
    assert all(len(ids) <= 2 * fe.MAX_SENTENCE_PHONEMES + 3 for ids in sentences)
    assert all(ids[-3] == space for ids in sentences[:-1])  # ends on a word boundary: ' ', PAD, EOS


def test_text_over_limit_is_rejected(frontend):
    with pytest.raises(InvalidInput, match="20001 characters; the limit is 20000"):
        frontend.sentence_ids("a" * 20_001)


def test_registered_phoneme_type_is_used(voice_config):
    class SyllablePhonemizer:
        def phonemize(self, text):
            return [[c for c in word] + [" "] for word in text.split()]

    register_phoneme_type("test-syllables", PhonemeScheme(lambda config: SyllablePhonemizer()))
    try:
        frontend = TextFrontend(dataclasses.replace(voice_config, phoneme_type="test-syllables"))
        assert isinstance(frontend.phonemizer, SyllablePhonemizer)
        assert len(list(frontend.sentence_ids("ab cd"))) == 2
    finally:
        fe._SCHEMES.pop("test-syllables")


def test_unsupported_phoneme_type_is_a_model_error(voice_config):
    with pytest.raises(ModelError, match="phoneme_type 'hebrew' is not supported"):
        TextFrontend(dataclasses.replace(voice_config, phoneme_type="hebrew"))


def test_text_phoneme_type_uses_codepoints(voice_config):
    config = dataclasses.replace(voice_config, phoneme_type="text")
    assert TextFrontend(config).phonemize("ab c") == [["a", "b", " ", "c"]]


def test_voice_loads_config_beside_onnx(cfg):
    from base import models

    voice = Voice.load(models.resolve_voice(cfg).path)
    assert voice.config.sample_rate == 22050 and voice.config.espeak_voice == "en-us"
    assert voice.config.language == "en" and voice.config.phoneme_type == "espeak"
