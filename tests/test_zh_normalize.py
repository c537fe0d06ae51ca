"""normalize_zh: numbers, dates, times, money, units and symbols read as Mandarin."""

from __future__ import annotations

import pytest

from tts_engine.zh.normalize import cardinal, digits, normalize_zh, unify_width


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # years and dates
        ("2026年", "二零二六年"),
        ("1998年出生", "一九九八年出生"),
        ("90年代", "九零年代"),
        ("2026年3月5日", "二零二六年三月五日"),
        ("2026-03-05", "二零二六年三月五日"),
        ("2026/3/5", "二零二六年三月五日"),
        ("2026年3月5日14:30见", "二零二六年三月五日十四点三十分见"),
        ("5月1日", "五月一日"),
        ("12月", "十二月"),
        ("3年", "三年"),
        ("2年", "两年"),
        # times
        ("14:30", "十四点三十分"),
        ("9:05", "九点零五分"),
        ("12:00", "十二点"),
        ("2:15", "两点十五分"),
        ("8:30:15", "八点三十分十五秒"),
        # phone numbers and codes: digit by digit, 1 = 幺
        ("13812345678", "幺三八幺二三四五六七八"),
        ("010-12345678", "零幺零幺二三四五六七八"),
        ("400-123-4567", "四零零幺二三四五六七"),
        ("验证码是2580", "验证码是二五八零"),
        ("房间号305", "房间号三零五"),
        ("007", "零零七"),
        # percentages, fractions, decimals, negatives, ordinals, ranges, ratios
        ("15.5%", "百分之十五点五"),
        ("-3%", "负百分之三"),
        ("5‰", "千分之五"),
        ("1/3", "三分之一"),
        ("3.14", "三点一四"),
        ("0.5", "零点五"),
        ("-12", "负十二"),
        ("第3章", "第三章"),
        ("第2名", "第二名"),
        ("3-5天", "三到五天"),
        ("2-3个", "两到三个"),
        ("比分3:2", "比分三比二"),
        # cardinals, 两 vs 二
        ("2个", "两个"),
        ("12个", "十二个"),
        ("2000块", "两千块"),
        ("2万人", "两万人"),
        ("200", "二百"),
        ("1,299", "一千二百九十九"),
        ("100000000人", "一亿人"),
        ("2.5公斤", "二点五公斤"),
        # money
        ("¥12.50", "十二点五元"),
        ("￥2", "两元"),
        ("$5", "五美元"),
        ("€20", "二十欧元"),
        ("£3", "三英镑"),
        ("¥3万", "三万元"),
        ("1,299元", "一千二百九十九元"),
        # units
        ("25kg", "二十五千克"),
        ("3-5km", "三到五公里"),
        ("60km/h", "六十公里每小时"),
        ("2m", "两米"),
        ("500ml", "五百毫升"),
        ("100m²", "一百平方米"),
        ("-5℃", "零下五摄氏度"),
        ("25.5°C", "二十五点五摄氏度"),
        ("98°F", "九十八华氏度"),
        ("90°", "九十度"),
        # symbols
        ("1+1=2", "一加一等于二"),
        ("3×4", "三乘四"),
        ("5>3", "五大于三"),
        ("A&B", "A和B"),
    ],
)
def test_normalize(text, expected):
    assert normalize_zh(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("你好,世界!", "你好，世界！"),
        ("你好. 再见", "你好。再见"),
        ("真的吗?", "真的吗？"),
        ("ＡＢＣ", "ABC"),
        ("１２个", "十二个"),
        ("（注意）", "（注意）"),
        ("等等...好", "等等…好"),
        ("等等……好", "等等…好"),
        ("version 3.14, ok", "version 三点一四, ok"),  # numbers are read in Chinese; no Hanzi near the comma
        ("价格:100元", "价格：一百元"),
    ],
)
def test_width_and_punctuation_unified(text, expected):
    assert normalize_zh(text) == expected


def test_unify_width_keeps_decimals_and_times():
    assert unify_width("圆周率3.14，时间12:30") == "圆周率3.14，时间12:30"


def test_latin_words_are_left_for_the_english_path():
    assert normalize_zh("我用Python写代码") == "我用Python写代码"


def test_cardinal_and_digits():
    assert cardinal("2026") == "两千零二十六"
    assert cardinal("10") == "十"
    assert cardinal("110") == "一百一十"
    assert cardinal("-0.25") == "负零点二五"
    assert cardinal("12345678901234567890") == "一二三四五六七八九零一二三四五六七八九零"  # too long: digits
    assert digits("2026") == "二零二六"
    assert digits("110", phone=True) == "幺幺零"


def test_normalize_is_idempotent():
    text = "今天是2026年3月5日，气温-5℃，我有2个苹果，花了¥12.5。"
    once = normalize_zh(text)
    assert normalize_zh(once) == once
