"""ClauseSegmenter: tokens in (as an LLM streams them), clauses out."""

from __future__ import annotations

import random
import re

import pytest

from tts_engine.segmenter import CJK_CHAR_WEIGHT, ClauseSegmenter, clause_weight
from base.config import TtsConfig


def segment(tokens: list[str], **limits: int) -> list[str]:
    seg = ClauseSegmenter(**limits)
    clauses: list[str] = []
    for token in tokens:
        clauses += seg.feed(token)
    return clauses + seg.flush()


def timeline(tokens: list[str], **limits: int) -> list[tuple[str, list[str]]]:
    """(token, clauses returned by feeding it) for every token, then ("<flush>", rest)."""
    seg = ClauseSegmenter(**limits)
    steps = [(token, seg.feed(token)) for token in tokens]
    return steps + [("<flush>", seg.flush())]


def llm_tokens(text: str, rng: random.Random) -> list[str]:
    """Split like a BPE tokenizer: words carry their leading space, some words split in pieces,
    punctuation often a token of its own, CJK one to three characters per token."""
    tokens: list[str] = []
    for match in re.finditer(r"\s*(?:[\u4e00-\u9fff]{1,3}|\w+|[^\w\s])", text):
        piece = match.group(0)
        while len(piece) > 3 and rng.random() < 0.4:
            cut = rng.randint(2, len(piece) - 1)
            tokens.append(piece[:cut])
            piece = piece[cut:]
        tokens.append(piece)
    trailing = text[len("".join(tokens)):]
    if trailing:
        tokens.append(trailing)
    assert "".join(tokens) == text
    return tokens


# -- sentence ends -----------------------------------------------------------


def test_english_sentences_emitted_as_soon_as_the_next_token_shows_the_end():
    steps = timeline(["Hello", " there", ".", " How", " are", " you", "?", " Fine", "!"])
    assert steps == [
        ("Hello", []), (" there", []), (".", []),  # "." could still be "there.com"
        (" How", ["Hello there."]), (" are", []), (" you", []), ("?", []),
        (" Fine", ["How are you?"]), ("!", []), ("<flush>", ["Fine!"]),
    ]


def test_chinese_sentence_ends_need_no_space():
    assert segment(["今天", "天气", "很好", "。", "我们", "去", "公园", "吧", "！", "好", "吗", "？"]) == [
        "今天天气很好。", "我们去公园吧！", "好吗？",
    ]


def test_decimal_point_is_held_until_the_next_token_and_not_a_break():
    steps = timeline(["Pi", " is", " about", " 3", ".", "14", " and", " e", " is", " 2", ".", "71", "."])
    assert all(out == [] for _, out in steps[:-1])
    assert steps[-1] == ("<flush>", ["Pi is about 3.14 and e is 2.71."])


@pytest.mark.parametrize("abbrev", ["Mr.", "Mrs.", "Dr.", "e.g.", "i.e.", "U.S.", "etc.", "vs.", "a.m.", "p.m."])
def test_no_break_after_abbreviations(abbrev):
    text = f"Ask about {abbrev} now please. Then go."
    assert segment(llm_tokens(text, random.Random(1))) == [f"Ask about {abbrev} now please.", "Then go."]


def test_abbreviations_tokenized_piecewise():
    tokens = ["I", " met", " Dr", ".", " Smith", " in", " the", " U", ".", "S", ".", " at", " 9", " a", ".m", ".", " It", " went", " well", "."]
    assert segment(tokens) == ["I met Dr. Smith in the U.S. at 9 a.m. It went well."]


def test_initials_and_list_numbers_do_not_end_sentences():
    assert segment(llm_tokens("J. K. Rowling wrote it. Next one.", random.Random(2))) == [
        "J. K. Rowling wrote it.", "Next one.",
    ]
    assert segment(["1", ".", " Drink", " water", ".", "\n", "2", ".", " Sleep", "."]) == [
        "1. Drink water.", "2. Sleep.",
    ]


def test_ellipsis_is_one_sentence_end_and_never_split_inside():
    assert segment(["Well", "..", ".", " I", " think", " so", "."]) == ["Well...", "I think so."]
    assert segment(["Wait", "...", "what", "?"]) == ["Wait...what?"]
    assert segment(["Hmm", "…", " maybe", "."]) == ["Hmm…", "maybe."]
    assert segment(["我想想", "……", "好吧", "。"]) == ["我想想……", "好吧。"]


def test_punctuation_only_run_joins_the_next_clause():
    assert segment(["...", " Hello", " there", ".", " Bye", "."]) == ["... Hello there.", "Bye."]


def test_urls_and_emails_are_not_split():
    text = "Visit https://example.com/a.b?c=1,2 or write to jane.doe@mail.example.org. Thanks!"
    assert segment(llm_tokens(text, random.Random(3))) == [
        "Visit https://example.com/a.b?c=1,2 or write to jane.doe@mail.example.org.", "Thanks!",
    ]


def test_closing_quote_stays_with_its_sentence():
    assert segment(["He", " said", ' "', "Stop", ".", '"', " Then", " he", " left", "."]) == [
        'He said "Stop."', "Then he left.",
    ]
    assert segment(["他", "说", "：", "“", "你好", "。", "”", "然后", "走", "了", "。"]) == [
        "他说：“你好。”", "然后走了。",
    ]
    assert segment(["(", "Really", "?", ")", " Yes", "."]) == ["(Really?)", "Yes."]


def test_no_break_inside_quotes_or_brackets():
    text = 'She read "One. Two! Three" aloud (see p. 4. It helps). Done.'
    assert segment(llm_tokens(text, random.Random(4))) == [
        'She read "One. Two! Three" aloud (see p. 4. It helps).', "Done.",
    ]
    assert segment(["他说", "「", "快走", "。", "别", "回头", "」", "。"]) == ["他说「快走。别回头」。"]


# -- clause breaks -------------------------------------------------------------


def test_comma_breaks_only_long_clauses_and_the_first_may_be_short():
    text = "Sure, I can help. Well, you know, first of all the weather today is lovely, so go out and enjoy it."
    assert segment(llm_tokens(text, random.Random(5))) == [
        "Sure, I can help.",  # "Sure," is 5 < first_min_chars=8
        "Well, you know, first of all the weather today is lovely,",  # >= 40 at this comma only
        "so go out and enjoy it.",
    ]
    assert segment(llm_tokens("Absolutely, I can help with that.", random.Random(6))) == [
        "Absolutely,", "I can help with that.",  # first clause: 11 >= 8
    ]


def test_comma_semicolon_colon_need_a_following_space():
    text = "The total is 1,000,000 dollars at 12:30 today; the deadline: tomorrow morning at nine."
    assert segment(llm_tokens(text, random.Random(7)), first_min_chars=8, min_chars=10) == [
        "The total is 1,000,000 dollars at 12:30 today;", "the deadline:", "tomorrow morning at nine.",
    ]


def test_comma_at_end_of_token_waits_for_the_next_character():
    steps = timeline(["Absolutely", ",", " yes"])
    assert steps[1] == (",", [])
    assert steps[2] == (" yes", ["Absolutely,"])


def test_chinese_clause_breaks_with_minimum_length():
    tokens = ["好的", "，", "我", "来", "帮你", "查", "一下", "，", "北京", "、", "上海", "、", "广州",
              "今天", "都", "有", "一点", "小", "雨", "；", "出门", "记得", "带", "伞", "。"]
    # weights: 好的， = 7 < 8 (no break); 好的，我来帮你查一下， = 9*3+2 >= 8; then 北京…小雨； = 14*3+3 >= 40 (its 、 come too early)
    assert segment(tokens) == [
        "好的，我来帮你查一下，", "北京、上海、广州今天都有一点小雨；", "出门记得带伞。",
    ]


def test_full_width_comma_breaks_without_waiting():
    steps = timeline(["我是", "你的", "语音", "助手", "，", "很", "高兴"])
    assert steps[4] == ("，", ["我是你的语音助手，"])


def test_ascii_punctuation_after_chinese_breaks_like_chinese():
    assert segment(["我", "是", "你的", "助手", ",", "今天", "很好", "!", "谢谢", "."]) == [
        "我是你的助手,", "今天很好!", "谢谢.",
    ]


def test_newline_ends_a_clause():
    assert segment(["Here", " is", " a", " list", "\n", "- eggs", "\n", "- milk"]) == [
        "Here is a list", "- eggs", "- milk",
    ]


# -- maximum length ---------------------------------------------------------------


def test_long_clause_is_cut_at_the_last_space_that_fits():
    words = ["word%02d" % i for i in range(30)]
    clauses = segment([" " + w for w in words], min_chars=20, max_chars=50)
    assert all(len(c) <= 50 for c in clauses)
    assert " ".join(clauses).split() == words
    assert all(not c.endswith(("word", "wo")) for c in clauses)  # never inside a word
    assert clauses[0] == " ".join(words[:7])  # 7 words = 48 chars; 8 would be 55


def test_long_chinese_clause_without_spaces_is_cut_anywhere():
    text = "这是一段非常非常长而且完全没有任何标点符号的中文句子用来测试最大长度的强制断句功能是否正常工作"
    clauses = segment(list(text), min_chars=20, max_chars=30)
    assert "".join(clauses) == text
    assert [len(c) for c in clauses[:-1]] == [10] * (len(clauses) - 1)  # 10 Hanzi x 3 = 30
    assert all(clause_weight(c) <= 30 for c in clauses)


def test_max_length_applies_inside_quotes():
    text = '"' + " ".join(["blah"] * 40) + '"'
    clauses = segment(llm_tokens(text, random.Random(8)), min_chars=20, max_chars=60)
    assert len(clauses) > 1 and all(len(c) <= 60 for c in clauses)


# -- whitespace, state ------------------------------------------------------------------


def test_clauses_are_stripped_and_never_blank():
    assert segment(["  ", "\n", " Hi", " there", ".", "   ", "\n\n", " ", "Bye", ".", "  \n"]) == [
        "Hi there.", "Bye.",
    ]
    assert segment(["   ", "\n"]) == []


def test_reset_drops_pending_text_and_restores_the_short_first_clause():
    seg = ClauseSegmenter()
    assert seg.feed("Absolutely, I") == ["Absolutely,"]
    seg.feed(" was saying")
    seg.reset()
    assert seg.pending == ""
    assert seg.feed("Right, then") == []  # "Right," is 6 < 8
    assert seg.feed(" anyway, yes") == ["Right, then anyway,"]  # first clause again: 8 is enough


def test_flush_starts_a_new_stream():
    seg = ClauseSegmenter()
    assert seg.feed("Absolutely, sure") == ["Absolutely,"]
    assert seg.flush() == ["sure"]
    assert seg.feed("Certainly, yes") == ["Certainly,"]  # first-clause minimum again


def test_from_config_uses_tts_limits():
    seg = ClauseSegmenter.from_config(TtsConfig(first_clause_min_chars=3, clause_min_chars=5, clause_max_chars=99))
    assert (seg.first_min_chars, seg.min_chars, seg.max_chars) == (3, 5, 99)
    defaults = ClauseSegmenter.from_config(TtsConfig())
    assert (defaults.first_min_chars, defaults.min_chars, defaults.max_chars) == (8, 40, 200)


@pytest.mark.parametrize(("text", "words", "clauses"), [
    ("The capital of France is Paris.", 0, ["The capital of France is Paris."]),
    ("The capital of France is Paris.", 3, ["The capital of France", "is Paris."]),  # not after "of"
    ("The capital of France is Paris.", 4, ["The capital of France", "is Paris."]),
    ("The capital of France is Paris.", 5, ["The capital of France is Paris."]),  # "is" leads on; then the end
    ("Paris.", 3, ["Paris."]),
    ("Hello! How can I help you today?", 3, ["Hello!", "How can I help you today?"]),  # punctuation first
    ("Sure, I can help you with that. Here it is.", 4, ["Sure, I can help", "you with that.", "Here it is."]),
    ("I would recommend booking a table at a nice place tonight.", 3,
     ["I would recommend", "booking a table at a nice place tonight."]),
    ("你好！我是你的语音助手，很高兴认识你。", 2, ["你好！", "我是你的语音助手，很高兴认识你。"]),  # no spaces: no cut
])
def test_first_clause_is_cut_after_a_few_words(text, words, clauses):
    """``first_max_words``: a first clause without punctuation in its first words is cut at a space."""
    assert segment([text], first_max_words=words) == clauses
    assert segment(list(text), first_max_words=words) == clauses


def test_the_first_clause_is_cut_once_its_last_word_is_complete():
    seg = ClauseSegmenter(first_max_words=4)
    assert seg.feed("The capital of France") == []  # "France" may go on
    assert seg.feed(" is") == ["The capital of France"]
    assert seg.feed(" Paris.") == [] and seg.flush() == ["is Paris."]


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError):
        ClauseSegmenter(min_chars=300, max_chars=200)
    with pytest.raises(ValueError, match="first_max_words"):
        ClauseSegmenter(first_max_words=-1)


def test_first_clause_max_words_from_config():
    from base.config import load_config
    from base.errors import ConfigError

    assert ClauseSegmenter.from_config(TtsConfig()).first_max_words == 0  # off by default
    assert ClauseSegmenter.from_config(TtsConfig(first_clause_max_words=4)).first_max_words == 4
    with pytest.raises(ConfigError, match=r"tts\.first_clause_max_words must be >= 0"):
        load_config(None, ["tts.first_clause_max_words=-1"], environ={})


def test_cjk_weight():
    assert clause_weight("ab你好") == 2 + 2 * CJK_CHAR_WEIGHT


# -- properties over random token splits ---------------------------------------------------

_CORPUS = [
    'Sure! The U.S. team, led by Dr. Lee, scored 3.5 points at 7 p.m. on Friday... "Great game," she said. '
    "See https://example.com/stats?id=42 or mail stats@example.com. Prices: $1,299.99, i.e. a lot; etc. "
    "Anyway (and this matters), we won! Right?! Next match is on 12:30 Sunday.\n1. Rest. 2. Train.",
    "你好！我是你的语音助手，很高兴认识你。今天北京的气温是3.5℃，有小雨；明天转晴。他说：“我们去公园吧！”"
    "好的……那就这么定了。价格是1,299元，网址是www.example.cn。",
    "我们用 Python 3.11 写了一个 voice assistant，它能说中文, also English. 真的吗？Yes, really! 一共有 "
    + "很多很多" * 30 + "。The end",
    " ".join(["lorem", "ipsum,", "dolor", "sit", "amet;", "consectetur:", "adipiscing", "elit."] * 20),
]


@pytest.mark.parametrize("limits", [{}, {"first_min_chars": 4, "min_chars": 12, "max_chars": 45},
                                    {"first_max_words": 3}])
@pytest.mark.parametrize("text", _CORPUS)
def test_any_token_split_gives_the_same_clauses_and_loses_no_text(text, limits):
    reference = segment([text], **limits)
    assert reference == segment(list(text), **limits)
    squeeze = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert squeeze("".join(reference)) == squeeze(text)
    max_chars = limits.get("max_chars", 200)
    assert all(c and c == c.strip() and clause_weight(c) <= max_chars for c in reference)
    rng = random.Random(hash(text) & 0xFFFF)
    for _ in range(40):
        if rng.random() < 0.5:
            tokens = llm_tokens(text, rng)
        else:  # arbitrary cuts, including inside "3.5", "...", URLs
            cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(1, len(text) // 3)))
            tokens = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert segment(tokens, **limits) == reference
