"""Chinese phonemes and ids for Piper voices: espeak-cmn voices and pinyin-symbol voices.

No Chinese Piper voice is available here, so the voice configs are built for the tests:
* espeak-cmn: Piper's default espeak id map (``piper/phoneme_ids.py``, the map Piper's espeak
  voices carry), espeak voice "cmn", language zh_CN — like zh_CN-huayan-medium.onnx.json;
* pinyin: the symbol table of Piper's pinyin voices, read from ``piper/phonemize_chinese.py``.
The end-to-end test uses a tiny ONNX "voice" that echoes its input ids as samples: it checks
the ids that reach the model, and produces no speech at all.
"""

from __future__ import annotations

import ast
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from tts_engine.espeak import piper_package_dir
from tts_engine.frontend import TextFrontend
from tts_engine.voice import VoiceConfig
from tts_engine.zh import phonemes as ph
from tts_engine.zh.phonemizer import ChinesePhonemizer, split_scripts


def _piper_chinese_reference() -> dict:
    """PHONEME_TO_ID, GROUP_END_PHONEMES and phonemes_to_ids from piper/phonemize_chinese.py,
    executed alone (the module itself imports g2pW and unicode_rbnf, not installed)."""
    source = (piper_package_dir() / "phonemize_chinese.py").read_text(encoding="utf-8")
    wanted = {"PHONEME_TO_ID", "GROUP_END_PHONEMES", "phonemes_to_ids"}
    nodes = [
        n for n in ast.parse(source).body
        if (isinstance(n, ast.FunctionDef) and n.name in wanted)
        or (isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
            getattr(t, "id", None) in wanted for t in (n.targets if isinstance(n, ast.Assign) else [n.target])))
    ]
    namespace: dict = {}
    exec("from collections.abc import Mapping, Sequence\nfrom typing import Optional\nimport logging\n"
         "_LOGGER = logging.getLogger('piper')\nPAD, BOS, EOS = '_', '^', '$'\n"
         "DEFAULT_PHONEME_ID_MAP = {'_': [0], '^': [1], '$': [2]}", namespace)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "phonemize_chinese.py", "exec"), namespace)
    return namespace


PIPER_ZH = _piper_chinese_reference()


def _default_espeak_map() -> dict:
    source = (piper_package_dir() / "phoneme_ids.py").read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "DEFAULT_PHONEME_ID_MAP")
    return ast.literal_eval(node.value)


ESPEAK_MAP = _default_espeak_map()


def voice_json(phoneme_type: str, id_map: dict, espeak_voice: str) -> dict:
    return {
        "audio": {"sample_rate": 22050},
        "espeak": {"voice": espeak_voice},
        "language": {"code": "zh_CN"},
        "phoneme_type": phoneme_type,
        "phoneme_id_map": id_map,
        "num_symbols": 256,
        "num_speakers": 1,
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
    }


@pytest.fixture(scope="module")
def pinyin_voice() -> VoiceConfig:
    return VoiceConfig.from_dict(voice_json("pinyin", PIPER_ZH["PHONEME_TO_ID"], "cmn"))


@pytest.fixture(scope="module")
def espeak_voice() -> VoiceConfig:
    return VoiceConfig.from_dict(voice_json("espeak", ESPEAK_MAP, "cmn"))


@pytest.fixture(scope="module")
def espeak_zh() -> ChinesePhonemizer:
    return ChinesePhonemizer("espeak")


# -- syllables -> symbols ---------------------------------------------------------


@pytest.mark.parametrize(
    ("syllable", "parts"),
    [
        ("yin2", ("y", "in", "2", False)),
        ("hang2", ("h", "ang", "2", False)),
        ("zhi1", ("zh", "i", "1", False)),
        ("er2", ("", "er", "2", False)),
        ("a1", ("", "a", "1", False)),
        ("ju2", ("j", "v", "2", False)),
        ("xue2", ("x", "ve", "2", False)),
        ("yuan2", ("y", "van", "2", False)),
        ("yun4", ("y", "vn", "4", False)),
        ("lve4", ("l", "ve", "4", False)),
        ("nv3", ("n", "v", "3", False)),
        ("dianr3", ("d", "ian", "3", True)),
        ("xiong2", ("x", "iong", "2", False)),
    ],
)
def test_split_syllable(syllable, parts):
    assert ph.split_syllable(syllable) == parts


def test_split_syllable_rejects_non_pinyin():
    with pytest.raises(ValueError):
        ph.split_syllable("hang")


def test_pinyin_symbols_follow_pipers_convention():
    assert ph.pinyin_symbols(["yin2", "hang2", "er2", "wanr2"]) == [
        "y", "in", "2", "h", "ang", "2", "Ø", "er", "2", "w", "an", "2", "Ø", "er", "5",
    ]
    every = {s for s in ph.pinyin_symbols(_ALL_SYLLABLES)}
    assert every <= set(PIPER_ZH["PHONEME_TO_ID"]), every - set(PIPER_ZH["PHONEME_TO_ID"])


_ALL_SYLLABLES = [
    f"{initial}{final}{tone}" for initial, finals in {
        "": ["a", "o", "e", "ai", "ei", "ao", "ou", "an", "en", "ang", "eng", "er"],
        "b": ["a", "o", "ai", "ei", "ao", "an", "en", "ang", "eng", "i", "ie", "iao", "ian", "in", "ing", "u"],
        "d": ["a", "e", "ai", "ei", "ao", "ou", "an", "ang", "eng", "ong", "i", "ia", "ie", "iao", "iu", "ian",
              "ing", "u", "uo", "ui", "uan", "un"],
        "l": ["v", "ve", "ia", "iang", "in"], "n": ["v", "ve", "iang"], "j": ["u", "ue", "uan", "un", "iong", "ia"],
        "q": ["u", "ue", "uan", "un", "iong", "i"], "x": ["u", "ue", "uan", "un", "iong", "ian"],
        "y": ["i", "a", "e", "ao", "ou", "an", "in", "ang", "ing", "ong", "u", "ue", "uan", "un"],
        "w": ["u", "a", "o", "ai", "ei", "an", "en", "ang", "eng"], "zh": ["i", "a", "e", "uang", "ong", "ui"],
        "ch": ["i", "uai", "uang"], "sh": ["i", "ua", "uo"], "r": ["i", "e", "ou", "an", "ong", "ui", "un"],
        "z": ["i", "a", "e", "uo", "un"], "c": ["i", "ai", "ong"], "s": ["i", "uo", "uan"],
        "g": ["e", "uai", "uang"], "k": ["e", "ua", "ong"], "h": ["e", "ui", "uo"], "f": ["a", "ei", "ou"],
        "m": ["iu", "ie", "iao"], "p": ["ou", "ian"], "t": ["ong", "iao", "ui"],
    }.items() for final in finals for tone in "12345"
]


def test_pinyin_ids_equal_pipers_encoding():
    id_map = PIPER_ZH["PHONEME_TO_ID"]
    symbols = ph.pinyin_symbols(["ni3", "hao3"]) + ["，"] + ph.pinyin_symbols(["yin2", "hang2"]) + ["。"]
    ours, skipped = ph.pinyin_ids(symbols, id_map)
    assert skipped == []
    assert ours == PIPER_ZH["phonemes_to_ids"](symbols, id_map)
    # BOS n i 3 _ h ao 3 _ ， _ y in 2 _ h ang 2 _ 。 _ EOS, ids from Piper's table
    assert ours == [1, 10, 39, 66, 0, 14, 32, 66, 0, 72, 0, 25, 45, 65, 0, 14, 36, 65, 0, 69, 0, 2]


# -- pinyin-symbol voices through the TextFrontend -----------------------------------------


def test_pinyin_voice_ids_through_the_frontend(pinyin_voice):
    frontend = TextFrontend(pinyin_voice)
    assert frontend.normalize("银行有2个。") == "银行有两个。"
    assert list(frontend.sentence_ids("银行有2个。")) == [[
        1, 25, 45, 65, 0, 14, 36, 65, 0,  # y in 2 _ h ang 2 _
        25, 33, 66, 0, 11, 46, 66, 0, 12, 29, 67, 0,  # y ou 3 _ l iang 3 _ g e 4 _
        69, 0, 2,  # 。 EOS
    ]]
    assert not frontend.unknown_phonemes


def test_polyphones_reach_the_pinyin_ids(pinyin_voice):
    frontend = TextFrontend(pinyin_voice)
    phonemes = frontend.phonemize(frontend.normalize("他长得很高，行不行？"))
    assert phonemes == [[
        "t", "a", "1", "zh", "ang", "3", "d", "e", "5", "h", "en", "3", "g", "ao", "1", "，",
        "x", "ing", "2", "b", "u", "5", "x", "ing", "2", "？",
    ]]


def test_third_tone_sandhi_option():
    assert ph.third_tone_sandhi([["ni3", "hao3"]]) == [["ni2", "hao3"]]
    assert ph.third_tone_sandhi([["zhan3", "lan3", "guan3"]]) == [["zhan2", "lan2", "guan3"]]
    assert ph.third_tone_sandhi([["wo3"], ["hen3"], ["hao3"]]) == [["wo2"], ["hen2"], ["hao3"]]
    assert ph.third_tone_sandhi([["jie3", "jie5"], ["hao3"]]) == [["jie3", "jie5"], ["hao3"]]
    surface = ChinesePhonemizer("pinyin", third_tone_sandhi=True).phonemize("你好")
    assert surface == [["n", "i", "2", "h", "ao", "3"]]
    assert ChinesePhonemizer("pinyin").phonemize("你好") == [["n", "i", "3", "h", "ao", "3"]]


def test_latin_letters_are_spelled_for_pinyin_voices(pinyin_voice):
    frontend = TextFrontend(pinyin_voice)
    assert frontend.phonemize("AI很强。") == [[
        "Ø", "ei", "1", "Ø", "ai", "4", "h", "en", "3", "q", "iang", "2", "。",
    ]]


# -- espeak-cmn voices ----------------------------------------------------------------------


def _espeak(text: str, voice: str = "cmn") -> list[list[str]]:
    from tts_engine.espeak import EspeakPhonemizer

    return EspeakPhonemizer(voice).phonemize(text)


def test_espeak_reads_our_pinyin_like_the_hanzi_of_that_reading():
    """For characters with one reading, espeak's reading of the Hanzi == its reading of our pinyin."""
    from pypinyin import Style, lazy_pinyin

    chars = "妈麻马骂中国人我你他好银爱吃喝水天地山火土木金月日年鱼鸟花草书笔纸门窗车船飞走跑跳看听说写" \
            "想要去来是有在和就都也很最太新旧大小多少高低冷热红绿蓝白黑快慢早晚东西南北春夏秋冬"
    agree = 0
    for char in chars:
        syllable = lazy_pinyin(char, style=Style.TONE3, neutral_tone_with_five=True)[0]
        agree += _espeak(char) == _espeak(ph.espeak_spelling(syllable))
    assert agree / len(chars) >= 0.95, f"{agree}/{len(chars)}"


def test_espeak_cmn_reads_every_syllable_but_the_known_few():
    from tts_engine.espeak import _ESPEAK_LOCK, bridge_for

    unreadable = []
    with _ESPEAK_LOCK:
        bridge = bridge_for("cmn")
        for syllable in _ALL_SYLLABLES:
            raw = "".join(p for p, _t, _e in bridge.get_phonemes(ph.espeak_spelling(syllable)))
            if "(" in raw or not raw:  # "(en)...": espeak gave up and read it as English
                unreadable.append(syllable)
    assert all(ph.ESPEAK_UNREADABLE.fullmatch(s) for s in unreadable), unreadable
    assert {s[:-1] for s in unreadable} == {"jiong", "qiong", "xiong"}


def test_espeak_tone_symbols():
    assert [_espeak(f"ma{t}")[0][-1] for t in "12345"] == [ph.ESPEAK_TONES[t] for t in "12345"]


def test_our_polyphones_replace_espeaks_own_reading(espeak_zh):
    """espeak reads 长得 from Hanzi as chang2 de2; our front end gives it zhang3 de5."""
    ours = espeak_zh.phonemize("他长得很高。")
    assert ours == _espeak("ta1 zhang3de5 hen3 gao1.")
    assert ours != _espeak("他长得很高。")
    assert "".join(ours[0]) == "thˈɑ5 ts.ɑ2ŋtˈə1 χˈə2n kˈɑu5."


def test_espeak_voice_ids_through_the_frontend(espeak_voice):
    frontend = TextFrontend(espeak_voice)
    ids = list(frontend.sentence_ids("银行。"))
    # ^ _ j _ i _ ɜ _ n _ χ _ ˈ _ ɑ _ ɜ _ ŋ _ . _ $  (Piper's default espeak map)
    assert ids == [[1, 0, 22, 0, 21, 0, 62, 0, 26, 0, 127, 0, 120, 0, 51, 0, 62, 0, 44, 0, 10, 0, 2]]
    assert not frontend.unknown_phonemes


def test_unreadable_syllables_are_composed(espeak_zh, espeak_voice):
    phonemes = espeak_zh.phonemize("熊猫很可爱。")
    assert "".join(phonemes[0]).startswith("ɕionɡɜmˈɑu5 ")
    assert "(" not in "".join(phonemes[0])
    assert set(p for s in phonemes for p in s) <= set(espeak_voice.phoneme_id_map)


def test_every_cmn_symbol_is_in_the_espeak_id_map(espeak_zh):
    text = "。".join(
        "".join(chr(c) for c in range(start, start + 40)) for start in range(0x4E00, 0x9FA5, 997)
    )
    symbols = {p for s in espeak_zh.phonemize(text) for p in s}
    assert len(symbols) > 25
    assert symbols <= set(ESPEAK_MAP), symbols - set(ESPEAK_MAP)


def test_mixed_chinese_english_is_one_sequence_with_pauses(espeak_zh, espeak_voice):
    assert split_scripts("我用Python写代码，OK吗？") == [
        ("我用", False), ("Python", True), ("写代码，", False), ("OK", True), ("吗？", False),
    ]
    sentences = espeak_zh.phonemize("我用Python写代码，OK吗？Yes, sure. 好的。")
    flat = ["".join(s) for s in sentences]
    assert flat == [
        "wˈo2 jˈonɡ5 pˈaɪθən ɕˈiɛ2 tai5mˈɑ2, ˌoʊkˈeɪ mˈɑ1?",
        "jˈɛs, ʃˈʊɹ.",
        "χˈɑu2 tˈə1.",
    ]
    frontend = TextFrontend(espeak_voice)
    ids = list(frontend.sentence_ids("我用Python写代码，OK吗？"))
    assert len(ids) == 1 and not frontend.unknown_phonemes
    assert ESPEAK_MAP[","][0] in ids[0] and ESPEAK_MAP["?"][0] in ids[0]


def test_chinese_punctuation_gives_the_same_pauses_as_ascii(espeak_zh):
    assert espeak_zh.phonemize("你好，世界！") == espeak_zh.phonemize("你好, 世界!")


# -- `voxloop say --voice` with a Chinese voice config ---------------------------------------


def _id_echo_model(path: Path) -> None:
    """A Piper-shaped ONNX model whose audio is its input ids / 1000 (no speech, only plumbing)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["as_float", "scale"], ["scaled"]),
            helper.make_node("Unsqueeze", ["scaled", "axis"], ["output"]),
        ],
        "id_echo",
        [
            helper.make_tensor_value_info("input", TensorProto.INT64, [1, None]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, None])],
        initializer=[
            helper.make_tensor("scale", TensorProto.FLOAT, [], [0.001]),
            helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.parametrize("phoneme_type", ["pinyin", "espeak"])
def test_say_with_a_chinese_voice_sends_our_ids_to_the_model(tmp_path, phoneme_type):
    pytest.importorskip("onnx")
    from voxloop.cli import main

    voice = tmp_path / f"zh_CN-test-{phoneme_type}.onnx"
    _id_echo_model(voice)
    id_map = PIPER_ZH["PHONEME_TO_ID"] if phoneme_type == "pinyin" else ESPEAK_MAP
    Path(f"{voice}.json").write_text(json.dumps(voice_json(phoneme_type, id_map, "cmn")), encoding="utf-8")
    out = tmp_path / "out.wav"
    assert main(["say", "--voice", str(voice), "-o", str(out), "银行。"]) == 0
    with wave.open(str(out)) as wav:
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    ids = np.round(samples / 32.767).astype(int).tolist()
    expected = (
        [1, 25, 45, 65, 0, 14, 36, 65, 0, 69, 0, 2] if phoneme_type == "pinyin"
        else [1, 0, 22, 0, 21, 0, 62, 0, 26, 0, 127, 0, 120, 0, 51, 0, 62, 0, 44, 0, 10, 0, 2]
    )
    assert ids == expected


def test_cmn_voice_without_language_code_uses_the_chinese_front_end():
    data = voice_json("espeak", ESPEAK_MAP, "cmn")
    del data["language"]
    frontend = TextFrontend(VoiceConfig.from_dict(data))
    assert isinstance(frontend.phonemizer, ChinesePhonemizer)
    assert frontend.normalize("2个") == "两个"


def test_english_voice_is_untouched_by_the_chinese_package(cfg):
    """Importing tts_engine.zh changes nothing for the bundled English voice."""
    from tts_engine.espeak import EspeakPhonemizer
    from base import models

    path = models.resolve_voice(cfg).path
    english = TextFrontend(VoiceConfig.load(models.voice_config_path(cfg, path)))
    assert type(english.phonemizer) is EspeakPhonemizer
    assert english.normalize("2 cats") == "2 cats"
