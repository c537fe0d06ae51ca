"""Chinese grapheme-to-pinyin accuracy: voxloop's front end beside plain pypinyin.

    python -m bench.zh_g2p_accuracy [--set tests/data/zh_polyphones.tsv]

Scores three readers on the hand-labelled set, by sentence and by syllable, per section
of the file and overall:
  ours               normalize_zh + ChineseG2p (lexicon, context rules, 一/不, erhua)
  pypinyin           pypinyin 0.55 as it comes, on the raw text (no number reading)
  pypinyin+normalize pypinyin on our normalized text (isolates the polyphone work)
Writes OUT/zh_g2p-<date>.json and .png (with date, hardware, command).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from pathlib import Path

from bench.harness import ROOT, add_output_arguments, write_json
from bench.zh_evaluation import Case, load_cases, score

DEFAULT_SET = ROOT / "tests" / "data" / "zh_polyphones.tsv"


def readers():
    from pypinyin import Style, lazy_pinyin

    from tts_engine.zh.g2p import ChineseG2p
    from tts_engine.zh.normalize import normalize_zh

    g2p = ChineseG2p()

    def plain(text: str) -> list[str]:
        syllables = lazy_pinyin(text, style=Style.TONE3, neutral_tone_with_five=True)
        return [s for s in syllables if re.fullmatch(r"[a-z]+[1-5]", s)]

    return {
        "ours": lambda s: g2p.pinyin(normalize_zh(s)),
        "pypinyin": plain,
        "pypinyin+normalize": lambda s: plain(normalize_zh(s)),
    }


def evaluate(cases: list[Case]) -> list[dict]:
    rows = []
    sections = ["all", *dict.fromkeys(c.section for c in cases)]
    for name, read in readers().items():
        for section in sections:
            subset = [c for c in cases if section in ("all", c.section)]
            start = time.perf_counter()
            result = score(subset, read)
            elapsed = time.perf_counter() - start
            row = {"reader": name, "section": section, **result.as_dict(),
                   "ms_per_sentence": round(1000 * elapsed / len(subset), 2)}
            if section != "all" or name != "ours":
                row.pop("failures")
            rows.append(row)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = list(dict.fromkeys(r["section"] for r in rows))
    names = list(dict.fromkeys(r["reader"] for r in rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [next(r["sentence_accuracy"] for r in rows if r["reader"] == name and r["section"] == s)
                  for s in sections]
        ax.bar([i + k * width for i in range(len(sections))], [100 * v for v in values], width, label=name)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(sections))])
    ax.set_xticklabels([s[:20] for s in sections], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("sentences right, %")
    ax.set_ylim(0, 100)
    ax.axhline(98, color="grey", linestyle="--", linewidth=0.8)
    ax.set_title("Chinese G2P accuracy by sentence (tests/data/zh_polyphones.tsv)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="TSV test set")
    add_output_arguments(parser)
    args = parser.parse_args()
    cases = load_cases(args.set)
    rows = evaluate(cases)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"zh_g2p-{dt.date.today().isoformat()}"
    write_json("zh_g2p", rows, {
        "test_set": str(args.set.relative_to(ROOT) if args.set.is_relative_to(ROOT) else args.set),
        "cases": len(cases),
    }, path=stem.with_suffix(".json"))  # fmt: skip
    plot(rows, stem.with_suffix(".png"))
    for r in rows:
        print(f"{r['reader']:20} {r['section'][:28]:28} {r['sentences']:4} sentences "
              f"{r['sentence_accuracy']:7.1%}  syllables {r['syllable_accuracy']:7.2%}  {r['ms_per_sentence']} ms")
    print(stem.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
