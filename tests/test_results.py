"""``bench/results/`` holds evidence for the docs' current figures, nothing else.

- every result file README.md or docs/*.md names exists (JSON parses);
- every file in ``bench/results/`` is named by a doc or a test: a file's ``.png`` and ``.meta.json``
  go with its ``.json`` (its plot and its command); ``{a,b}`` and ``*`` in a name are expanded;
- no absolute path of the machine a run was made on (temporary or home folders, a checkout's own
  path) in the results, README.md or docs/*.md: commands are written relative to the repository
  with placeholders for the user's files (``VOICE.onnx``, ``OUT/``);
- the folder stays within ``BUDGET_BYTES``.

Superseded results leave the tree; docs/benchmarks.md's history cites the commit that holds them
(``git show COMMIT:bench/results/NAME``). Benches write outside the tree unless run with ``--save``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "bench/results"
BUDGET_BYTES = 5 * 1024 * 1024
#: ``bench/results/NAME`` in a doc, not a ``COMMIT:bench/results/NAME`` of the history.
EXT = r"\.(?:json|md|png|txt|\{[\w.,]+\})"
NAMED = re.compile(rf"(?<![\w:])bench/results/([\w.\-{{}},*]+?{EXT})(?!\w)")
#: A result file's name anywhere in a doc or test (with ``{a,b}`` or ``*`` in it).
MENTION = re.compile(rf"[\w{{}},*][\w.\-{{}},*]*?{EXT}(?!\w)")
#: An absolute path of a machine: temporary and home folders, where checkouts and outputs live.
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:tmp|root|work|home|Users|mnt|scratch)/\S*")


def docs(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def citing_texts(root: Path) -> list[str]:
    """What may cite a result: README.md, docs/*.md and the tests."""
    return [p.read_text(encoding="utf-8") for p in [*docs(root), *sorted((root / "tests").glob("*.py"))] if p.is_file()]


def expand(pattern: str) -> list[str]:
    """``a-{x,y}.json`` -> ``[a-x.json, a-y.json]`` (nested braces are not used)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [e for alt in m.group(1).split(",") for e in expand(pattern[: m.start()] + alt + pattern[m.end() :])]


def stem(name: str) -> str:
    """The run a file belongs to: ``x.json``, ``x.meta.json`` and ``x.png`` are all ``x``."""
    for ext in (".meta.json", ".json", ".png"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def missing_results(root: Path) -> dict[str, list[str]]:
    """``{result named by a doc that does not exist: [docs naming it]}``; JSON that does not parse counts."""
    missing: dict[str, list[str]] = {}
    for doc in docs(root):
        for name in NAMED.findall(doc.read_text(encoding="utf-8")):
            found = [list((root / RESULTS).glob(pattern)) for pattern in expand(name)]
            if not all(found) or any(p.suffix == ".json" and not _parses(p) for files in found for p in files):
                missing.setdefault(name, []).append(doc.name)
    return missing


def _parses(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return True


def uncited_results(root: Path) -> list[str]:
    """Files in ``bench/results/`` that no doc or test names (their run's ``.json`` counts for a PNG or meta)."""
    patterns = {p for text in citing_texts(root) for m in MENTION.findall(text) for p in expand(m)}
    cited_stems = set()
    names = sorted(p.name for p in (root / RESULTS).iterdir() if p.is_file())
    for name in names:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            cited_stems.add(stem(name) if name.endswith(".json") else name)
    return [n for n in names if n not in cited_stems and stem(n) not in cited_stems]


def machine_paths(root: Path) -> list[str]:
    """``file:line: path`` for each absolute machine path in the results, README.md and docs/*.md."""
    files = [*sorted(p for p in (root / RESULTS).iterdir() if p.is_file() and p.suffix != ".png"), *docs(root)]
    found = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(root)}:{i}: {m.group(0)}" for m in MACHINE_PATH.finditer(line)]
    return found


def results_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / RESULTS).rglob("*") if p.is_file())


# ---------------------------------------------------------------- the real tree


def test_every_named_result_exists_and_parses():
    assert len(NAMED.findall((ROOT / "README.md").read_text(encoding="utf-8"))) >= 10
    assert missing_results(ROOT) == {}


def test_every_result_file_is_cited():
    assert uncited_results(ROOT) == []


def test_no_machine_paths_in_results_or_docs():
    assert machine_paths(ROOT) == []


def test_results_stay_within_budget():
    assert results_bytes(ROOT) <= BUDGET_BYTES, f"{results_bytes(ROOT) / 2**20:.1f} MiB"


def test_readme_area_tables_link_their_results():
    """Each table of "Where things stand" links at least one result file or names its command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Where things stand") :]
    section = section[: section.index("\n## ", 1)]
    areas = section.split("\n### ")[1:]
    assert len(areas) >= 6
    for area in areas:
        assert NAMED.search(area) and "python -m bench." in area, area.splitlines()[0]


# ---------------------------------------------------------------- the checks fail when they should


def machine_path(*parts: str) -> str:
    """An absolute path of some machine, spelled so that this file itself names none."""
    return "/" + "/".join(parts)


def small_tree(root: Path) -> Path:
    """A tree that passes every check: one cited result with its plot and meta."""
    (root / "docs").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / RESULTS).mkdir(parents=True)
    (root / "README.md").write_text("Figures: `bench/results/run-cpu-2026-12-01.json` (`python -m bench.run --out OUT/`).\n")
    (root / "docs" / "more.md").write_text("Both runs: `bench/results/pair-{a,b}.json`.\n")
    (root / "tests" / "test_x.py").write_text('DATA = "fixture-*.json"\n')
    for name in ("run-cpu-2026-12-01.json", "run-cpu-2026-12-01.meta.json", "pair-a.json", "pair-b.json",
                 "fixture-1.json"):  # fmt: skip
        (root / RESULTS / name).write_text('{"command": "python -m bench.run --voice VOICE.onnx"}\n')
    (root / RESULTS / "run-cpu-2026-12-01.png").write_bytes(b"\x89PNG")
    return root


def test_checks_pass_on_a_clean_tree(tmp_path):
    root = small_tree(tmp_path)
    assert missing_results(root) == {}
    assert uncited_results(root) == []
    assert machine_paths(root) == []
    assert results_bytes(root) <= BUDGET_BYTES


def test_a_planted_machine_path_fails(tmp_path):
    root = small_tree(tmp_path)
    voice, home = machine_path("tmp", "voice", "x.onnx"), machine_path("home", "someone", "voxloop")
    (root / RESULTS / "pair-a.json").write_text(f'{{"command": "python -m bench.run --voice {voice}"}}\n')
    with (root / "docs" / "more.md").open("a") as f:
        f.write(f"Run it from {home}.\n")
    assert machine_paths(root) == [f"bench/results/pair-a.json:1: {voice}\"}}", f"docs/more.md:2: {home}."]
    assert MACHINE_PATH.search("sounds in /usr/share/sounds/alsa, OUT/, $HOME/x, ~/.cache/voxloop") is None


def test_an_orphan_result_fails(tmp_path):
    root = small_tree(tmp_path)
    (root / RESULTS / "forgotten-2026-11-30.json").write_text("{}\n")
    (root / RESULTS / "pair-c.png").write_bytes(b"\x89PNG")
    assert uncited_results(root) == ["forgotten-2026-11-30.json", "pair-c.png"]


def test_a_missing_or_broken_named_result_fails(tmp_path):
    root = small_tree(tmp_path)
    (root / RESULTS / "pair-b.json").unlink()
    (root / RESULTS / "run-cpu-2026-12-01.json").write_text("{")
    assert missing_results(root) == {"pair-{a,b}.json": ["more.md"], "run-cpu-2026-12-01.json": ["README.md"]}
    with (root / "docs" / "more.md").open("a") as f:
        f.write("History: `git show 1234abc:bench/results/gone.json`.\n")  # a commit's file, not the tree's
    assert "gone.json" not in missing_results(root)


def test_an_oversized_results_folder_fails(tmp_path):
    root = small_tree(tmp_path)
    (root / RESULTS / "fixture-big.json").write_bytes(b" " * (BUDGET_BYTES + 1))
    assert results_bytes(root) > BUDGET_BYTES


# ---------------------------------------------------------------- what benches write


def test_benches_write_outside_the_tree_unless_saved(monkeypatch, tmp_path):
    import argparse

    from bench import harness

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VOXLOOP_BENCH_OUT", raising=False)
    parser = argparse.ArgumentParser()
    harness.add_common_arguments(parser)
    assert parser.parse_args([]).out == tmp_path / "cache" / "voxloop" / "bench"
    assert parser.parse_args(["--save"]).out == ROOT / RESULTS
    assert parser.parse_args(["--out", "x"]).out == Path("x")
    with pytest.raises(SystemExit):  # one or the other
        parser.parse_args(["--save", "--out", "x"])
    assert harness.result_path("r", "json", hardware="box", date="d") == tmp_path / "cache" / "voxloop" / "bench" / "r-box-d.json"


def test_recorded_commands_name_no_machine_path(monkeypatch, tmp_path):
    """A result's command is one anyone can repeat from the repository's root: paths inside it relative,
    the output folder ``OUT/``, user files as named placeholders."""
    from bench import harness

    assert harness.portable(str(ROOT / "bench" / "voice_questions.txt")) == "bench/voice_questions.txt"
    assert harness.portable("relative/path.txt") == "relative/path.txt"

    monkeypatch.setenv("VOXLOOP_BENCH_OUT", str(tmp_path / "out"))
    voice = machine_path("tmp", "voices", "en_US-joe-medium.onnx")
    monkeypatch.setenv("VOXLOOP_TTS__VOICE_PATH", voice)
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--voice", voice, f"--config={ROOT}/configs/gpu.toml",
                                      "--out", str(tmp_path / "out" / "a"), "--model", machine_path("home", "me", "qwen.gguf"),
                                      "--wav", machine_path("root", "speech.wav"), "--n", "3"])  # fmt: skip
    command = harness.command_line()
    assert "VOXLOOP_TTS__VOICE_PATH=VOICE.onnx " in command and "VOXLOOP_BENCH_OUT" not in command
    assert command.endswith(" --voice VOICE.onnx --config=configs/gpu.toml --out OUT/ --model MODEL.gguf "
                            "--wav SPEECH.wav --n 3")  # fmt: skip
    assert MACHINE_PATH.search(command) is None
    assert harness.portable_args(["--set=tts.voice_path=" + voice, "--config", str(ROOT / "configs" / "gpu.toml")]) == [
        "--set=tts.voice_path=VOICE.onnx", "--config", "configs/gpu.toml"]  # fmt: skip
