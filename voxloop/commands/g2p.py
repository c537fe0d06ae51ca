"""``voxloop g2p TEXT``: show how the Chinese front end reads text.

Prints two lines: the normalized text (numbers, dates, units... as Hanzi), then the
pinyin, one syllable per token with tone digits 1-5 (5 = neutral), space-separated,
punctuation dropped; Latin words are printed as they are.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from voxloop.commands import config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("g2p", help="print the normalized text and pinyin of Chinese text")
    p.add_argument("text", help="text to convert")
    p.add_argument("--lexicon", type=Path, help="extra lexicon (TSV or TOML); default tts.zh_lexicon_path")
    p.add_argument("--phonemes", choices=("espeak", "pinyin"),
                   help="also print the phonemes for an espeak-cmn or a pinyin-symbol voice")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tts_engine.zh.g2p import ChineseG2p
    from tts_engine.zh.lexicon import Lexicon
    from tts_engine.zh.normalize import normalize_zh

    cfg = config_from_args(args)
    lexicon_path = args.lexicon if args.lexicon is not None else cfg.tts.zh_lexicon_path
    g2p = ChineseG2p(Lexicon.load(lexicon_path))
    normalized = normalize_zh(args.text)
    print(normalized)
    print(" ".join(g2p.pinyin(normalized)))
    if args.phonemes:
        from tts_engine.zh.phonemizer import ChinesePhonemizer

        phonemizer = ChinesePhonemizer(args.phonemes, g2p)
        for sentence in phonemizer.phonemize(normalized):
            print(("" if args.phonemes == "espeak" else " ").join(sentence))
    return 0
