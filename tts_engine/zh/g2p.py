"""Chinese grapheme-to-pinyin with polyphone disambiguation.

``ChineseG2p.pinyin(text)`` -> syllables like ``["yin2", "hang2"]`` (tone 5 = neutral,
``v`` = ü, erhua merged: ``dianr3``), for text already through ``normalize_zh``.

Steps: jieba segmentation with part-of-speech tags (its dictionary plus our lexicon's
words) -> our lexicon, else pypinyin's phrase data, per word -> context rules for
polyphones pypinyin gets wrong (得 地 了 行 长 还 种 只 干 数 倒 ...) -> neutral tone of
reduplicated verbs and kinship nouns -> tone changes of 一 and 不 -> erhua.

The tones are the ones written in teaching pinyin: citation tones, with the tone
changes of 一 and 不 written (``yi2 ge4``, ``bu2 shi4``); third-tone sandhi is not
written here — ``phonemes.third_tone_sandhi`` applies it for voices that want it.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field

import jieba
import jieba.posseg
from pypinyin import Style, lazy_pinyin
from pypinyin.constants import PHRASES_DICT
from pypinyin.seg.mmseg import seg as mmseg

from tts_engine.zh.lexicon import Lexicon, is_erhua

HANZI = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_NUMERALS = set("零一二两三四五六七八九十百千万亿几半")
_DEMONSTRATIVES = set("这那哪每各某")
_KINSHIP = set("妈爸哥姐弟妹爷奶姥叔伯舅婶姑姨婆公宝娃星")
_NEUTRAL_PARTICLES = {"的": "de5", "吗": "ma5", "呢": "ne5", "吧": "ba5", "啊": "a5", "呀": "ya5", "啦": "la5", "嘛": "ma5"}
#: 儿 after these is a word of its own meaning child (女儿 nv3 er2), not erhua.
_NOT_ERHUA = set("女婴孤幼胎健男宠患少侄孙孩")
_PUNCTUATION = re.compile(r"[^\w]+|_+")

#: Placeholder syllable of a Hanzi pypinyin has no reading for (dropped from the output).
_NO_PINYIN = "_"
_PINYIN = re.compile(r"[a-zü]+[1-5]")

jieba.setLogLevel(logging.WARNING)


@dataclass
class Word:
    """A segment of the sentence: its text, jieba POS tag and one syllable per Hanzi."""

    text: str
    pos: str
    syllables: list[str] = field(default_factory=list)
    #: Per character: pronunciation from our lexicon, which context rules leave alone.
    locked: list[bool] = field(default_factory=list)
    #: Per character: no phrase decided its reading (context rules may).
    free: list[bool] = field(default_factory=list)

    @property
    def is_chinese(self) -> bool:
        return bool(HANZI.search(self.text))


class ChineseG2p:
    """Chinese text -> pinyin; thread-safe; build once (loads jieba, ~1 s)."""

    def __init__(self, lexicon: Lexicon | None = None) -> None:
        self.lexicon = lexicon if lexicon is not None else Lexicon.load()
        self._lock = threading.Lock()
        tokenizer = jieba.Tokenizer()
        tokenizer.initialize()
        for word in self.lexicon:
            if len(word) > 1 and HANZI.search(word):
                tokenizer.add_word(word, freq=tokenizer.suggest_freq(word, tune=False))
        self._segmenter = jieba.posseg.POSTokenizer(tokenizer)

    def words(self, text: str) -> list[Word]:
        """Segment ``text`` and give every Chinese word its syllables (rules applied)."""
        with self._lock:
            pairs = [(p.word, p.flag) for p in self._segmenter.lcut(text)]
        words = [self._lookup(text, pos) for text, pos in pairs]
        chars = _CharView(words)
        for rule in (_polyphones, _reduplication, _yi_bu):
            rule(chars)
        for word in words:
            word.syllables = [s for s in _merge_erhua(word) if s != _NO_PINYIN]
        return words

    def pinyin(self, text: str) -> list[str]:
        """Syllables for the Chinese in ``text``, other words as they are; punctuation dropped."""
        out: list[str] = []
        for word in self.words(text):
            if word.is_chinese:
                out.extend(word.syllables)
            else:
                out.extend(t for t in _PUNCTUATION.split(word.text) if t)
        return out

    def _lookup(self, text: str, pos: str) -> Word:
        """Syllables of one segment: our lexicon for it or for its pypinyin phrases, else pypinyin."""
        if not HANZI.search(text):
            return Word(text, pos)
        word = Word(text, pos)
        if text in self.lexicon:
            _add_lexicon(word, self.lexicon[text])
            return word
        pending = ""
        for piece in mmseg.cut(text) if len(text) > 1 else [text]:
            entry = self.lexicon.get(piece) if len(piece) > 1 else None
            if entry is None:
                pending += piece
                continue
            if pending:
                _add_pypinyin(word, pending, alone=False)
                pending = ""
            _add_lexicon(word, entry)
        if pending:
            _add_pypinyin(word, pending, alone=len(text) == 1)
        return word


def _add_lexicon(word: Word, syllables: tuple[str, ...]) -> None:
    expanded = _expand_erhua(list(syllables))
    word.syllables += expanded
    word.locked += [True] * len(expanded)
    word.free += [False] * len(expanded)


def _add_pypinyin(word: Word, text: str, alone: bool) -> None:
    """Append pypinyin's syllables for ``text``; a character is free unless one of its phrases covers it."""
    word.syllables += pypinyin_syllables(text)
    word.locked += [False] * len(text)
    if alone:
        word.free.append(True)
        return
    for piece in mmseg.cut(text):
        word.free += [len(piece) == 1 or piece not in PHRASES_DICT] * len(piece)


def pypinyin_syllables(text: str) -> list[str]:
    """pypinyin's reading of ``text`` (its phrase data), one syllable per character."""
    syllables = lazy_pinyin(
        text, style=Style.TONE3, neutral_tone_with_five=True, errors=lambda chars: [_NO_PINYIN] * len(chars)
    )
    return [s if _PINYIN.fullmatch(s) else _NO_PINYIN for s in syllables]


def citation_tone(char: str) -> int:
    """The most common tone of a single Hanzi (pypinyin's first reading)."""
    syllable = lazy_pinyin(char, style=Style.TONE3, neutral_tone_with_five=True)[0]
    return int(syllable[-1]) if syllable[-1:].isdigit() else 0


def _expand_erhua(syllables: list[str]) -> list[str]:
    """Lexicon syllables -> one per character (erhua ``dianr3`` -> ``dianr3``, ``r``)."""
    out: list[str] = []
    for syllable in syllables:
        out.append(syllable)
        if is_erhua(syllable):
            out.append("r")  # placeholder for the 儿, removed by _merge_erhua
    return out


class _CharView:
    """The sentence as Hanzi positions: char, its word, syllable get/set, neighbours."""

    def __init__(self, words: list[Word]) -> None:
        self.items: list[tuple[Word, int]] = []  # (word, index in word); None gaps for non-Chinese
        for word in words:
            if not word.is_chinese:
                self.items.append((word, -1))
                continue
            for k in range(len(word.text)):
                self.items.append((word, k))

    def __len__(self) -> int:
        return len(self.items)

    def char(self, i: int) -> str:
        if not 0 <= i < len(self.items):
            return ""
        word, k = self.items[i]
        return word.text[k] if k >= 0 else ""

    def word(self, i: int) -> Word | None:
        return self.items[i][0] if 0 <= i < len(self.items) else None

    def syllable(self, i: int) -> str:
        """The syllable at ``i``; "" outside the sentence or for a character without pinyin."""
        if not 0 <= i < len(self.items):
            return ""
        word, k = self.items[i]
        syllable = word.syllables[k] if 0 <= k < len(word.syllables) else ""
        return "" if syllable == _NO_PINYIN else syllable

    def set(self, i: int, syllable: str) -> None:
        word, k = self.items[i]
        if word.syllables[k] != _NO_PINYIN:
            word.syllables[k] = syllable

    def fixed(self, i: int) -> bool:
        """From our lexicon (or not Chinese): no rule changes it."""
        if not 0 <= i < len(self.items):
            return True
        word, k = self.items[i]
        return k < 0 or word.locked[k]

    def alone(self, i: int) -> bool:
        """Context decides the reading: a one-character word, or in a segment pypinyin has no phrase for."""
        if not 0 <= i < len(self.items):
            return False
        word, k = self.items[i]
        return k >= 0 and word.free[k]

    def same_word(self, i: int, j: int) -> bool:
        return 0 <= j < len(self.items) and self.word(i) is self.word(j)

    def text_after(self, i: int, n: int = 2) -> str:
        """Up to ``n`` Hanzi after ``i``, stopping at punctuation or other script."""
        out = ""
        for j in range(i + 1, i + 1 + n):
            char = self.char(j)
            if not char:
                break
            out += char
        return out

    def tone(self, i: int) -> int:
        """Tone of the syllable at ``i``; a neutral tone counts as the character's citation tone."""
        syllable = self.syllable(i)
        if not syllable or not syllable[-1].isdigit():
            return 0
        tone = int(syllable[-1])
        return citation_tone(self.char(i)) if tone == 5 else tone


# -- context rules --------------------------------------------------------------

_HUAN_OBJECTS = set("钱书债款账")
_ZHONG4_OBJECTS = set("树花菜地田草瓜豆麦稻粮庄苗")
_DAO4_OBJECTS = set("水茶酒垃车杯咖奶")
_GAN4_NEXT = ("什么", "啥", "吗", "嘛", "活", "完", "得", "吧", "掉", "事", "过", "好")
_ZHANG3_NEXT = set("得大高出胖满")
_VERBISH = ("v", "a", "d")


def _polyphones(c: _CharView) -> None:
    for i in range(len(c)):
        if c.fixed(i):
            continue
        char = c.char(i)
        rule = _CHAR_RULES.get(char)
        if rule is not None:
            syllable = rule(c, i)
            if syllable:
                c.set(i, syllable)
        elif char in _NEUTRAL_PARTICLES and c.alone(i):
            c.set(i, _NEUTRAL_PARTICLES[char])


def _pos(word: Word | None) -> str:
    return word.pos if word is not None else ""


def _prev_word(c: _CharView, i: int) -> Word | None:
    word = c.word(i)
    j = i - 1
    while j >= 0 and c.word(j) is word:
        j -= 1
    return c.word(j) if j >= 0 else None


def _next_word(c: _CharView, i: int) -> Word | None:
    word = c.word(i)
    j = i + 1
    while j < len(c) and c.word(j) is word:
        j += 1
    return c.word(j) if j < len(c) else None


def _de_complement(c: _CharView, i: int) -> str | None:
    """得: de5 after a verb/adjective (跑得快), dei3 as 'must' (我得走), else de2 (得了奖)."""
    if not c.alone(i):
        return None
    if c.same_word(i, i - 1):
        return "de5"  # jieba joined V得X (说得对): a complement
    prev, nxt = _prev_word(c, i), _next_word(c, i)
    if prev is not None and prev.is_chinese and _pos(prev)[:1] in ("v", "a", "b") and _pos(prev) != "ad":
        return "de5"
    if (prev is None or _pos(prev)[:1] in ("r", "n", "d", "c", "t", "x")) and (
        _pos(nxt)[:1] in _VERBISH or (nxt is not None and nxt.text.startswith(_DEI3_NEXT))
    ):
        return "dei3"
    if prev is not None and prev.is_chinese and _pos(c.word(i)) == "ud" and _pos(nxt)[:1] in ("d", "a", "z"):
        return "de5"
    return "de2"


def _de_adverbial(c: _CharView, i: int) -> str | None:
    """地: de5 after an adverbial (慢慢地走), else di4 (这块地)."""
    if not c.alone(i):
        return None
    if c.same_word(i, i - 1) and not c.same_word(i, i + 1):
        return "de5"  # jieba joined the adverbial and its 地 (轻轻地); nouns in 地 are phrases (草地)
    prev = _prev_word(c, i)
    if prev is None or not prev.is_chinese:
        return "di4"
    reduplicated = len(prev.text) >= 2 and prev.text[-1] == prev.text[-2]
    if reduplicated or _pos(prev)[:1] in ("a", "d", "z", "i", "l") or (
        _pos(c.word(i)) == "uv" and _pos(prev)[:1] not in ("n", "r", "s", "f", "m", "q", "p")
    ):
        return "de5"
    return "di4"


def _le(c: _CharView, i: int) -> str | None:
    """了: liao3 in a potential complement (吃不了, 受得了), else le5."""
    if not c.alone(i):
        return None
    if c.char(i - 1) in ("不", "得") and _pos(c.word(i - 2))[:1] == "v":
        return "liao3"
    return "le5"


def _xing(c: _CharView, i: int) -> str | None:
    """行: hang2 as a measure word (两行字), else as pypinyin has it."""
    if c.char(i - 1) in _NUMERALS and c.char(i + 1) != "人" and c.char(i - 2) != "银":
        return "hang2"
    return "xing2" if c.alone(i) else None


def _zhang(c: _CharView, i: int) -> str | None:
    """长: zhang3 as 'grow' (长得, 长高), else pypinyin."""
    if not c.alone(i):
        return None
    return "zhang3" if c.char(i + 1) in _ZHANG3_NEXT else "chang2"


def _huan(c: _CharView, i: int) -> str | None:
    """还: huan2 'give back' before what is returned (还钱, 还你书), else hai2."""
    if not c.alone(i):
        return None
    after = c.text_after(i, 3)
    if not after:
        return "huan2"  # clause-final: the verb (按时还), never the adverb
    if after[:1] in _HUAN_OBJECTS or after[:1] == "给" or (after[:1] in "我你他她它" and after[1:2] in _HUAN_OBJECTS):
        return "huan2"
    return "hai2"


def _zhong(c: _CharView, i: int) -> str | None:
    """种: zhong4 'to plant' (种树), zhong3 'kind' (这种)."""
    if not c.alone(i):
        return None
    if c.char(i + 1) in _ZHONG4_OBJECTS or _pos(c.word(i)) == "v":
        return "zhong4"
    return "zhong3"


def _zhi(c: _CharView, i: int) -> str | None:
    """只: zhi1 as a measure word (一只猫), else zhi3 'only'."""
    if c.char(i - 1) in _NUMERALS or c.char(i - 1) in _DEMONSTRATIVES:
        return "zhi1"
    return "zhi3" if c.alone(i) else None


def _gan(c: _CharView, i: int) -> str | None:
    """干: gan4 'do' (干什么, 干活), else pypinyin (gan1 'dry')."""
    if not c.alone(i):
        return None
    after = c.text_after(i, 2)
    if after.startswith(_GAN4_NEXT) or (after[:1] == "了" and after[1:2] in _NUMERALS):
        return "gan4"  # 干什么, 干了三天
    return "gan1" if after[:1] == "了" or not after else None


def _shu(c: _CharView, i: int) -> str | None:
    """数: shu3 'to count' as a verb (数钱), else shu4."""
    if not c.alone(i):
        return None
    return "shu3" if _pos(c.word(i)) == "v" or c.char(i + 1) in ("钱", "星", "了", "到") else "shu4"


def _dao(c: _CharView, i: int) -> str | None:
    """倒: dao4 'pour/reverse' before a liquid or vehicle (倒水), else pypinyin."""
    if not c.alone(i):
        return None
    return "dao4" if c.char(i + 1) in _DAO4_OBJECTS else "dao3"


def _zhe(c: _CharView, i: int) -> str | None:
    """着: zhe5 as the durative particle after a verb."""
    return "zhe5" if c.alone(i) else None


def _jiao(c: _CharView, i: int) -> str | None:
    """教: jiao1 'to teach' as a word of its own (教我做饭); jiao4 comes from words (教室)."""
    return "jiao1" if c.alone(i) else None


def _bei(c: _CharView, i: int) -> str | None:
    """背: bei1 'carry on the back' (背着书包), else pypinyin (bei4)."""
    return "bei1" if c.alone(i) and c.char(i + 1) in ("着", "起", "包") else None


def _ceng(c: _CharView, i: int) -> str | None:
    """曾: zeng1 as a surname before a title (曾先生), else ceng2."""
    return "zeng1" if c.text_after(i, 2) in _TITLES or c.text_after(i, 1) == "总" else None


def _feng(c: _CharView, i: int) -> str | None:
    """缝: feng4 'a seam' after a numeral/measure (一条缝), else feng2 'to sew'."""
    if not c.alone(i):
        return None
    return "feng4" if c.char(i - 1) in _NUMERALS or c.char(i - 1) in "条道个" else "feng2"


def _wei(c: _CharView, i: int) -> str | None:
    """为: wei2 in 为人 'as a person' (他为人正直); wei4 'for' (为人民服务) as pypinyin has it."""
    if not c.alone(i):
        return None
    if c.char(i + 1) == "人" and c.alone(i + 1) and c.text_after(i + 1, 2)[:1] in "很真十非正和老诚热":
        return "wei2"
    return "wei2" if c.char(i - 1) in _WEI2_AFTER and c.char(i - 1) else None


_WEI2_AFTER = "选称成作认以视评改列定封化分"  # 选为 称为 分为: 'as, into'
_TITLES = {"先生", "女士", "老师", "小姐", "经理", "同学", "教授", "医生", "大夫", "阿姨"}
_DEI3_NEXT = ("多", "少", "先", "快", "早", "马上", "赶紧", "赶快", "好好", "再", "去", "来", "走", "给")

_CHAR_RULES = {
    "得": _de_complement, "地": _de_adverbial, "了": _le, "行": _xing, "长": _zhang, "还": _huan,
    "种": _zhong, "只": _zhi, "干": _gan, "数": _shu, "倒": _dao, "着": _zhe, "教": _jiao, "背": _bei,
    "曾": _ceng, "缝": _feng, "为": _wei,
}


def _reduplication(c: _CharView) -> None:
    """AA kinship nouns and verbs: the second syllable is neutral (妈妈 ma1 ma5, 看看 kan4 kan5)."""
    for i in range(1, len(c)):
        word = c.word(i)
        if word is None or c.fixed(i) or word is not c.word(i - 1) or c.char(i) != c.char(i - 1):
            continue
        if c.char(i) in _KINSHIP or (len(word.text) == 2 and _pos(word).startswith("v")):
            c.set(i, c.syllable(i)[:-1] + "5")


_YI1_AFTER = set("第之加减乘除于比")  # ordinals, fractions (三分之一), arithmetic
_YI1_BEFORE = set("月号日加减乘除等比")  # dates, arithmetic


def _yi_bu(c: _CharView) -> None:
    """Tone changes of 一 and 不 (written in teaching pinyin)."""
    for i in range(len(c)):
        char = c.char(i)
        if char not in ("一", "不") or c.fixed(i):
            continue
        prev, nxt = c.char(i - 1), c.char(i + 1)
        if prev and prev == nxt and prev not in _NUMERALS:
            c.set(i, "yi5" if char == "一" else "bu5")  # 看一看, 是不是
            continue
        next_tone = c.tone(i + 1) if nxt else 0
        if char == "不":
            c.set(i, "bu2" if next_tone == 4 else "bu4")
            continue
        if not nxt or prev in _YI1_AFTER or nxt in _YI1_BEFORE or (nxt in _NUMERALS and nxt not in "百千万亿") or (
            prev in _NUMERALS and prev not in "万亿"
        ):
            c.set(i, "yi1")  # counting, ordinals, dates, word-final: 十一, 第一, 一二三
        elif next_tone:
            c.set(i, "yi2" if next_tone == 4 else "yi4")


def _merge_erhua(word: Word) -> list[str]:
    """Fold 儿 into the syllable before it (玩儿 wanr2), unless it means 'child' (女儿)."""
    out: list[str] = []
    for k, syllable in enumerate(word.syllables):
        if syllable == "r":
            continue  # lexicon erhua placeholder
        if (
            k > 0 and word.text[k] == "儿" and syllable.startswith("er") and out
            and HANZI.match(word.text[k - 1]) and word.text[k - 1] not in _NOT_ERHUA and not is_erhua(out[-1])
            and not word.locked[k] and out[-1][:-1] != "er"
        ):
            out[-1] = out[-1][:-1] + "r" + out[-1][-1]
            continue
        out.append(syllable)
    return out
