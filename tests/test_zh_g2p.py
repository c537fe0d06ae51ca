"""Chinese grapheme-to-pinyin: the hand-labelled polyphone set, rules, lexicon files, CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pypinyin import Style, lazy_pinyin

from bench.zh_evaluation import load_cases, score, syllable_errors
from tts_engine.zh.g2p import ChineseG2p
from tts_engine.zh.lexicon import Lexicon
from tts_engine.zh.normalize import normalize_zh
from base.errors import ConfigError

TEST_SET = Path(__file__).parent / "data" / "zh_polyphones.tsv"


@pytest.fixture(scope="module")
def g2p() -> ChineseG2p:
    return ChineseG2p()


def plain_pypinyin(text: str) -> list[str]:
    """pypinyin as it comes (its phrase data, no normalizer, no rules)."""
    syllables = lazy_pinyin(text, style=Style.TONE3, neutral_tone_with_five=True)
    return [s for s in syllables if re.fullmatch(r"[a-z]+[1-5]", s)]


def test_polyphone_set_accuracy(g2p):
    cases = load_cases(TEST_SET)
    assert len(cases) >= 200
    ours = score(cases, lambda s: g2p.pinyin(normalize_zh(s)))
    baseline = score(cases, plain_pypinyin)
    report = (
        f"ours: {ours.sentence_accuracy:.1%} of {ours.sentences} sentences, "
        f"{ours.syllable_accuracy:.2%} of {ours.syllables} syllables; plain pypinyin: "
        f"{baseline.sentence_accuracy:.1%} / {baseline.syllable_accuracy:.2%}; failures: {ours.failures}"
    )
    print(report)
    assert ours.sentence_accuracy >= 0.98, report
    assert ours.sentence_accuracy > baseline.sentence_accuracy


def test_scoring_counts_alignment_errors():
    assert syllable_errors(("a1", "b2", "c3"), ["a1", "b2", "c3"]) == 0
    assert syllable_errors(("a1", "b2", "c3"), ["a1", "x2", "c3"]) == 1
    assert syllable_errors(("a1", "b2", "c3"), ["a1", "c3"]) == 1  # one missing costs one
    assert syllable_errors(("a1",), ["a1", "b2", "c3"]) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("行不行", "xing2 bu5 xing2"),
        ("银行", "yin2 hang2"),
        ("长得很高", "zhang3 de5 hen3 gao1"),
        ("事情", "shi4 qing5"),
        ("跑得快", "pao3 de5 kuai4"),
        ("我得走了", "wo3 dei3 zou3 le5"),
        ("慢慢地走", "man4 man4 de5 zou3"),
        ("这块地", "zhe4 kuai4 di4"),
        ("我的书", "wo3 de5 shu1"),
        ("吃不了", "chi1 bu4 liao3"),
    ],
)
def test_issue_examples(g2p, text, expected):
    assert " ".join(g2p.pinyin(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("一个", "yi2 ge4"),  # before tone 4
        ("一天", "yi4 tian1"),  # before tones 1-3
        ("一年", "yi4 nian2"),
        ("一起", "yi4 qi3"),
        ("第一", "di4 yi1"),  # ordinal
        ("十一", "shi2 yi1"),  # in a number
        ("一二三", "yi1 er4 san1"),  # counting
        ("统一", "tong3 yi1"),  # word-final
        ("看一看", "kan4 yi5 kan4"),  # A一A
        ("三分之一", "san1 fen1 zhi1 yi1"),
        ("不去", "bu2 qu4"),
        ("不好", "bu4 hao3"),
        ("是不是", "shi4 bu5 shi4"),  # A不A
        ("不", "bu4"),
    ],
)
def test_yi_and_bu_tone_changes(g2p, text, expected):
    assert " ".join(g2p.pinyin(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("玩儿", "wanr2"),
        ("一点儿", "yi4 dianr3"),
        ("花儿", "huar1"),
        ("哪儿", "nar3"),
        ("女儿", "nv3 er2"),  # 儿 = child, not erhua
        ("儿子", "er2 zi5"),
        ("婴儿", "ying1 er2"),
    ],
)
def test_erhua(g2p, text, expected):
    assert " ".join(g2p.pinyin(text)) == expected


def test_neutral_tone_of_reduplication(g2p):
    assert g2p.pinyin("妈妈") == ["ma1", "ma5"]
    assert g2p.pinyin("看看") == ["kan4", "kan5"]
    assert g2p.pinyin("慢慢") == ["man4", "man4"]  # adjectives keep their tone


def test_latin_words_kept_and_punctuation_dropped(g2p):
    assert g2p.pinyin("我用Python，好吗？") == ["wo3", "yong4", "Python", "hao3", "ma5"]


def test_user_lexicon_tsv_overrides(tmp_path):
    user = tmp_path / "mine.tsv"
    user.write_text("# my words\n银行\tyin2 xing2\n曾小明\tzeng1 xiao3 ming2\n", encoding="utf-8")
    g2p = ChineseG2p(Lexicon.load(user))
    assert g2p.pinyin("银行") == ["yin2", "xing2"]
    assert g2p.pinyin("曾小明来了") == ["zeng1", "xiao3", "ming2", "lai2", "le5"]


def test_user_lexicon_toml(tmp_path):
    user = tmp_path / "mine.toml"
    user.write_text('[words]\n"重庆" = "chong2 qing4"\n"好玩儿" = "hao3 wanr2"\n', encoding="utf-8")
    lexicon = Lexicon.load(user)
    assert lexicon["好玩儿"] == ("hao3", "wanr2")
    assert ChineseG2p(lexicon).pinyin("好玩儿") == ["hao3", "wanr2"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("银行\tyin hang2\n", "not pinyin"),
        ("银行\tyin2\n", "2 characters but 1 syllables"),
        ("银行 yin2 hang2\n", "expected 'word<TAB>pinyin'"),
    ],
)
def test_bad_lexicon_lines_name_the_file_and_line(tmp_path, content, message):
    user = tmp_path / "bad.tsv"
    user.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as info:
        Lexicon.load(user)
    assert "bad.tsv" in str(info.value)


def test_missing_lexicon_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        Lexicon.load(tmp_path / "nope.tsv")


def test_builtin_lexicon_is_valid():
    lexicon = Lexicon.load()
    assert len(lexicon) > 200
    assert lexicon["银行"] == ("yin2", "hang2")


def test_g2p_command_prints_normalized_text_then_pinyin(capsys):
    from voxloop.cli import main

    assert main(["g2p", "他长得很高，2026年见。"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["他长得很高，二零二六年见。", "ta1 zhang3 de5 hen3 gao1 er4 ling2 er4 liu4 nian2 jian4"]


def test_g2p_command_uses_lexicon_option(tmp_path, capsys):
    from voxloop.cli import main

    user = tmp_path / "mine.tsv"
    user.write_text("银行\tyin2 xing2\n", encoding="utf-8")
    assert main(["g2p", "--lexicon", str(user), "银行"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "yin2 xing2"
