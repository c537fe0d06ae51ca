"""Traditional -> Simplified conversion of Chinese transcripts (OpenCC t2s)."""

from __future__ import annotations

import pytest

from asr.zh import is_chinese_language, postprocess_transcript, to_simplified


@pytest.mark.parametrize(
    ("traditional", "simplified"),
    [
        ("我們明天開會", "我们明天开会"),
        ("這個軟體很好用", "这个软体很好用"),
        ("頭髮很乾淨", "头发很干净"),  # 髮/發 -> 发, 乾 -> 干 by phrase
        ("乾隆皇帝", "乾隆皇帝"),  # a name: 乾 stays
        ("今天天气很好", "今天天气很好"),  # already Simplified
        ("Hello, 世界! 123", "Hello, 世界! 123"),
        ("", ""),
    ],
)
def test_to_simplified(traditional, simplified):
    assert to_simplified(traditional) == simplified


@pytest.mark.parametrize(
    ("language", "expected"),
    [("zh", True), ("zh-TW", True), ("zh_CN", True), ("cmn", True), ("yue", True), ("en", False), (None, False)],
)
def test_is_chinese_language(language, expected):
    assert is_chinese_language(language) is expected


def test_postprocess_only_for_chinese_and_when_enabled():
    assert postprocess_transcript("開會", "zh") == "开会"
    assert postprocess_transcript("開會", "zh", simplified=False) == "開會"
    assert postprocess_transcript("開會", "en") == "開會"
