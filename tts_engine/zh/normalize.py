"""Chinese text normalization: digits, dates, times, money, units and symbols -> Hanzi.

``normalize_zh(text)`` rewrites what a pinyin front end cannot read into the words
a Mandarin speaker says, and unifies full-/half-width forms:

* full-width letters/digits/symbols -> ASCII (``１２ＡＢ`` -> ``12AB``); ``,.!?;:``
  next to Hanzi -> ``，。！？；：``; ``...``/``……`` -> ``…``.
* years ``2026年`` -> 二零二六年; dates ``2026-03-05`` -> 二零二六年三月五日;
  times ``12:30`` -> 十二点三十分; phone numbers and codes digit by digit
  (``1`` read 幺); percentages, fractions, decimals, negatives, ordinals
  (``第3`` -> 第三), ranges (``3-5`` -> 三到五); currency (``¥``, ``$``, ``€``,
  ``£``); units (km, kg, ℃, …); arithmetic symbols.
* 2 is 两 before a measure word (``2个`` -> 两个) and at the head of
  千/万/亿 (``2000`` -> 两千), 二 elsewhere (``12``, ``第2``, ``2.5``).

Numbers become words with cn2an; Latin words are left for the English path.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import cn2an

# -- width and punctuation -------------------------------------------------------

_KEEP_FULL_WIDTH = set("，。！？；：（）")
_TO_FULL = {",": "，", ".": "。", "!": "！", "?": "？", ";": "；", ":": "："}
_HAN = r"\u3400-\u4dbf\u4e00-\u9fff"


def unify_width(text: str) -> str:
    """Full-width ASCII forms -> ASCII (CJK punctuation kept); ASCII punctuation next to Hanzi -> full width."""
    chars = []
    for ch in text:
        code = ord(ch)
        if 0xFF01 <= code <= 0xFF5E and ch not in _KEEP_FULL_WIDTH:
            ch = chr(code - 0xFEE0)
        elif ch == "\u3000":
            ch = " "
        chars.append(ch)
    text = "".join(chars)
    text = re.sub(r"\.{3,}|…+", "…", text)
    # ",.!?;:" after a Hanzi, or before one (not between digits: 3.14, 12:30, 1,000).
    text = re.sub(rf"(?<=[{_HAN}])\s*([,.!?;:])\s*", lambda m: _TO_FULL[m.group(1)], text)
    return re.sub(rf"(?<!\d)([,.!?;:])\s*(?=[{_HAN}])", lambda m: _TO_FULL[m.group(1)], text)


# -- numbers -------------------------------------------------------------------

_DIGITS = "零一二三四五六七八九"
_PHONE_DIGITS = "零幺二三四五六七八九"
#: Measure words and units after which 2 is read 两.
_MEASURES = (
    "个位只本条张次回天年岁件台辆斤两杯瓶碗块元角分毛人口家所座间种样双对份篇首部句步层页片颗棵朵匹头"
    "点小时周星期月公里米千克公斤克升吨倍遍趟场把支枝根节门辈代千万亿"
)


def cardinal(number: str) -> str:
    """Arabic integer or decimal string -> Chinese (``"2026"`` -> 两千零二十六, ``"3.14"`` -> 三点一四)."""
    number = number.replace(",", "")
    sign = ""
    if number.startswith("-"):
        sign, number = "负", number[1:]
    whole, _, fraction = number.partition(".")
    whole = whole.lstrip("0") or "0"
    if len(whole) > 16:
        words = digits(whole)
    else:
        words = cn2an.an2cn(whole)
        words = re.sub(r"^二(?=[千万亿])", "两", words)
    if fraction:
        words += "点" + digits(fraction)
    return sign + words


def digits(number: str, phone: bool = False) -> str:
    """Read digit by digit (``"2026"`` -> 二零二六); ``phone`` reads 1 as 幺."""
    table = _PHONE_DIGITS if phone else _DIGITS
    return "".join(table[int(d)] if d.isdigit() else "" for d in number)


def count(number: str, following: str) -> str:
    """A cardinal that counts ``following`` (2 -> 两 before a measure word)."""
    if number == "2" and following and following[0] in _MEASURES:
        return "两"
    return cardinal(number)


# -- rules, applied in order -----------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_UNITS = {
    "km/h": "公里每小时", "m/s": "米每秒", "km²": "平方公里", "m²": "平方米", "㎡": "平方米", "m³": "立方米",
    "cm²": "平方厘米", "km": "公里", "cm": "厘米", "mm": "毫米", "m": "米", "kg": "千克", "mg": "毫克",
    "g": "克", "ml": "毫升", "mL": "毫升", "L": "升", "kHz": "千赫兹", "MHz": "兆赫兹", "Hz": "赫兹",
    "kW": "千瓦", "W": "瓦", "mAh": "毫安时", "V": "伏", "h": "小时", "min": "分钟", "ms": "毫秒", "s": "秒",
    "℃": "摄氏度", "°C": "摄氏度", "°F": "华氏度", "°": "度",
}
_UNIT_PATTERN = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
_CURRENCY_PREFIX = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑"}
_CODE_CUES = ("电话", "手机", "号码", "号是", "号为", "编号", "尾号", "邮编", "验证码", "密码", "房间", "车次", "航班", "热线", "拨打")
_SYMBOLS = {"+": "加", "=": "等于", "×": "乘", "÷": "除以", ">": "大于", "<": "小于", "≥": "大于等于", "≤": "小于等于",
            "±": "正负"}


def _year(m: re.Match[str]) -> str:
    return digits(m.group(1)) + "年"


def _date(m: re.Match[str]) -> str:
    year, month, day = m.group("y"), m.group("m"), m.group("d")
    out = digits(year) + "年" if year else ""
    out += cardinal(month) + "月"
    return out + (cardinal(day) + (m.group("suffix") or "日") if day else "")


def _time(m: re.Match[str]) -> str:
    hour, minute, second = m.group(1), m.group(2), m.group(3)
    out = count(hour.lstrip("0") or "0", "点") + "点"
    if minute != "00" or second:
        out += ("零" + digits(minute[1]) if minute[0] == "0" and minute != "00" else cardinal(minute)) + "分"
    if second:
        out += cardinal(second) + "秒"
    return out


def _phone(m: re.Match[str]) -> str:
    return digits(m.group(0), phone=True)


def _coded(m: re.Match[str]) -> str:
    return m.group(1) + digits(m.group(2), phone=True)


def _percent(m: re.Match[str]) -> str:
    sign = "负" if m.group(1) else ""
    return sign + ("千分之" if m.group(3) == "‰" else "百分之") + cardinal(m.group(2))


def _fraction(m: re.Match[str]) -> str:
    return cardinal(m.group(2)) + "分之" + cardinal(m.group(1))


def _money_prefix(m: re.Match[str]) -> str:
    sign = "负" if m.group(1) else ""
    return sign + _amount(m.group(3)) + (m.group(4) or "") + _CURRENCY_PREFIX[m.group(2)]


def _amount(number: str) -> str:
    number = number.replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return count(number, "元")


def _temperature(m: re.Match[str]) -> str:
    below = "零下" if m.group(1) else ""
    return below + cardinal(m.group(2)) + _UNITS[m.group(3)]


def _unit(m: re.Match[str]) -> str:
    unit = _UNITS[m.group(2)]
    return count(m.group(1), unit) + unit


def _range(m: re.Match[str]) -> str:
    unit = _UNITS[m.group(3)] if m.group(3) else ""
    following = unit or m.group(4)
    return count(m.group(1), following) + "到" + count(m.group(2), following) + unit


def _ratio(m: re.Match[str]) -> str:
    return cardinal(m.group(1)) + "比" + cardinal(m.group(2))


def _ordinal(m: re.Match[str]) -> str:
    return "第" + cardinal(m.group(1))


def _symbol(m: re.Match[str]) -> str:
    return _SYMBOLS[m.group(0).strip()]


def _number(m: re.Match[str]) -> str:
    number, following = m.group(1), m.group(2)
    if len(number.replace(",", "").split(".")[0]) > 1 and number.startswith("0") and "." not in number:
        return digits(number) + following  # codes like 007, 0571
    return count(number, following) + following


_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    # dates and times before anything splits their digits
    (re.compile(r"(?<!\d)(?P<y>\d{4})[-/.年](?P<m>\d{1,2})[-/.月](?P<d>\d{1,2})(?:(?P<suffix>[日号])|(?!\d))"), _date),
    (re.compile(r"(?<!\d)(?P<y>)(?P<m>\d{1,2})月(?P<d>\d{1,2})?(?P<suffix>[日号])?"), _date),
    (re.compile(r"(?<![\d.])([12]\d{3}|\d{2}(?=年代))年"), _year),
    (re.compile(r"(?<![\d:])([01]?\d|2[0-4]):([0-5]\d)(?::([0-5]\d))?(?![\d:])"), _time),
    # phone numbers and codes: digit by digit
    (re.compile(r"(?<!\d)(?:\+?86[- ]?)?1[3-9]\d{9}(?!\d)"  # mobile
                r"|(?<!\d)0\d{2,3}-\d{7,8}(?!\d)"  # landline with area code
                r"|(?<!\d)400-?\d{3}-?\d{4}(?!\d)"), _phone),  # 400 hotlines
    (re.compile(rf"((?:{'|'.join(_CODE_CUES)})[^\d，。！？；]{{0,4}}?)(\d{{3,}})(?![\d.])"), _coded),
    # signed and scaled quantities
    (re.compile(r"(-|负)?(\d+(?:\.\d+)?)\s*(℃|°C|°F)"), _temperature),
    (re.compile(rf"(-)?({_NUM})\s*([%‰])"), _percent),
    (re.compile(r"(?<![\d/])(\d+)/(\d+)(?![\d/])"), _fraction),
    (re.compile(r"(-)?([¥￥$€£])\s?(\d[\d,]*(?:\.\d+)?)([万亿]?)"), _money_prefix),
    (re.compile(rf"(?<![A-Za-z\d.])(\d+)\s?[-~～—–]\s?(\d+)(?:\s?({_UNIT_PATTERN})(?![A-Za-z²³]))?(?=(\D?))"), _range),
    (re.compile(rf"(?<![A-Za-z\d.])(\d+(?:\.\d+)?)\s?({_UNIT_PATTERN})(?![A-Za-z²³])"), _unit),
    (re.compile(r"(?<![\d:])(\d+):(\d+)(?![\d:])"), _ratio),
    (re.compile(r"第\s?(\d+)"), _ordinal),
    (re.compile(r"(?<=\d)\s?[+=×÷><≥≤±]\s?(?=[\d-])|(?<=\s)[×÷=±](?=\s)"), _symbol),
    (re.compile(r"(?<![A-Za-z\d.])-(?=\d)"), lambda m: "负"),
    (re.compile(r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(\D?)"), _number),
]


def normalize_zh(text: str) -> str:
    """Chinese text ready for grapheme-to-pinyin: numbers and symbols as Hanzi, punctuation unified."""
    text = unify_width(text)
    for pattern, replace in _RULES:
        text = pattern.sub(replace, text)
    text = text.replace("&", "和").replace("%", "百分号")
    return text
