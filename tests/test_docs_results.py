"""Figures in README.md and docs/ rest on stored results: every result file they name exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULT = re.compile(r"bench/results/[\w.\-]+\.(?:json|md|png)")


def named_results() -> dict[str, list[str]]:
    """``{result path: [documents naming it]}``."""
    named: dict[str, list[str]] = {}
    for doc in DOCS:
        for path in RESULT.findall(doc.read_text(encoding="utf-8")):
            named.setdefault(path, []).append(doc.name)
    return named


def test_every_named_result_exists_and_parses():
    named = named_results()
    assert len([p for p in named if p.endswith(".json")]) >= 10  # the README's sections name theirs
    missing = {p: docs for p, docs in named.items() if not (ROOT / p).is_file()}
    assert missing == {}
    for path in named:
        if path.endswith(".json"):
            json.loads((ROOT / path).read_text(encoding="utf-8"))


def test_every_benchmark_section_names_its_result():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    benchmarks = readme[readme.index("## Benchmarks"):readme.index("## Deployment")]
    for section in benchmarks.split("\n### ")[1:]:
        assert RESULT.search(section), section.splitlines()[0]
