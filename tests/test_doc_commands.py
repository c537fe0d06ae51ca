"""Every shell command quoted in README.md and docs/*.md still works, so the docs cannot drift.

Commands are taken from ``sh``/``bash`` code blocks, from ``$ `` lines of plain blocks (their
printed output must match the lines after them) and from inline code that starts with a
program of this project (``voxloop``, ``python -m``, ``make``, ``scripts/``). Each is handled
by the first rule of ``RULES`` that matches it:

- ``run``: runs as written (no GPU, no network, seconds), from the repository root;
- ``help``: would run long, need a server, audio hardware, a GPU or the network: its
  ``--help`` must succeed and name every option the command uses; ``VOXLOOP_*`` variables,
  ``--config`` and ``--set`` of a ``voxloop`` command must load (``load_config``);
- ``make``: ``make -n TARGET`` (the target exists; its recipe is printed, not run);
- ``skip``: needs a container engine, a cluster, or a kit copied to another host; the
  repository paths it names must exist.

A command no rule matches fails: add a rule (the test states why each kind is not run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import scaled

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Inline code that is a command of this project (not prose like `pip wheel` or `docker stop`).
INLINE_PROGRAMS = re.compile(r"^(\w+=\S+ )*(voxloop|\.venv/bin/voxloop|python -m|make|scripts/)\b")
#: Usage synopses (``voxloop serve [--port P]``, ``voxloop g2p TEXT``): checked against --help.
SYNOPSIS = re.compile(r"\[|…|<\w+>|\b(FILE|TEXT|DIR|PATH|VENV|HZ|F|H|P)\b")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str
    #: Lines printed after a ``$`` prompt in the doc, to compare with the real output.
    output: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def commands() -> list[Command]:
    found: list[Command] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        doc = str(path.relative_to(ROOT))
        blocks = list(re.finditer(r"```(\w*)\n(.*?)```", text, re.S))
        for block in blocks:
            start = text[: block.start()].count("\n") + 2
            lines = block.group(2).replace("\\\n", " \\\n").splitlines()
            if block.group(1) in ("sh", "bash"):
                joined, first = "", None
                for i, line in enumerate(lines):
                    first = start + i if first is None else first
                    joined += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
                    if not line.rstrip().endswith("\\"):
                        if joined.strip() and not joined.lstrip().startswith("#"):
                            found.append(Command(doc, first, " ".join(joined.split())))
                        joined, first = "", None
            elif block.group(1) == "":
                for i, line in enumerate(lines):
                    if line.startswith("$ "):
                        out = []
                        for after in lines[i + 1 :]:
                            if not after.strip() or after.startswith("$ "):
                                break
                            out.append(after)
                        found.append(Command(doc, start + i, line[2:], tuple(out)))
        prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for m in re.finditer(r"`([^`\n]+)`", prose):
            if INLINE_PROGRAMS.match(m.group(1)) and " " in m.group(1):
                found.append(Command(doc, prose[: m.start()].count("\n") + 1, m.group(1)))
    return found


# (pattern on the command without its VAR=value prefix, action, why)
RULES: list[tuple[str, str, str]] = [
    (r"voxloop (--help|g2p (?!TEXT|--lexicon$)|say \"text\" -o out.wav$|models( --no-checksum)?$)", "run",
     "CPU only, bundled models, seconds"),
    (r"(\.venv/bin/)?voxloop( |$)", "help", "a server, a client of one, or a voice not bundled"),
    (r"python -m bench\.<name>", "skip", "a placeholder"),
    (r"python -m bench\.", "help", "benchmarks run for minutes (and some need a GPU)"),
    (r"python docker/stage_models\.py", "help", "copies every model (for an image build)"),
    (r"make (run|test|test-fast|docker-test|venv|wheelhouse|gpu)\b", "make",
     "sets up a venv (with CUDA builds for gpu), runs the suite or builds an image"),
    (r"nvidia-smi\b", "skip", "needs an NVIDIA driver (the GPU quick start; make gpu runs it first)"),
    (r"scripts/wheelhouse\.sh", "help", "downloads from the package index (tests/test_wheelhouse.py runs it)"),
    (r"(dist/kit|gpu-kit)/install\.sh|/opt/voxloop/bin/voxloop|tar -xf gpu-kit", "skip",
     "on the target host, from a built kit (tests/test_wheelhouse.py installs one)"),
    (r"python -m venv VENV", "skip", "a step of install.sh (tests/test_wheelhouse.py runs it)"),
    (r"haproxy -f docker/haproxy-host\.cfg", "skip",
     "a balancer in front of running replicas (tests/test_scaleout.py starts it with this file)"),
    (r"docker |kubectl ", "skip",
     "needs a container engine or a cluster (tests/test_docker_image.py, tests/test_deploy.py)"),
]


def split_env(text: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(text, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def rule_for(command: Command) -> tuple[str, str]:
    plain = re.sub(r"""^([A-Z_][A-Z0-9_]*=("[^"]*"|'[^']*'|\S+) +)+""", "", command.text)
    for pattern, action, why in RULES:
        if re.match(pattern, plain):
            return action, why
    pytest.fail(f"{command}: no rule in tests/test_doc_commands.py says how to check this command")


def voxloop(words: list[str]) -> list[str]:
    """``voxloop …`` as this interpreter runs it from the repository."""
    return [sys.executable, "-m", "voxloop", *words[1:]]


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=scaled(timeout_s))  # fmt: skip


def check_voxloop_config(words: list[str], env: dict[str, str]) -> None:
    """The command's --config, --set and VOXLOOP_* variables load (no unknown key, valid values)."""
    from base.config import load_config

    config, overrides = None, []
    for i, word in enumerate(words):
        if word == "--config" and SYNOPSIS.search(words[i + 1]) is None:
            config = ROOT / words[i + 1]
        elif word == "--set":
            overrides.append(words[i + 1])
        elif word.startswith("--set="):
            overrides.append(word.removeprefix("--set="))
    load_config(config, overrides, environ={k: v for k, v in env.items() if k.startswith("VOXLOOP_")})


def help_names_options(argv: list[str], words: list[str], env: dict[str, str]) -> None:
    out = run([*argv, "--help"], env)
    assert out.returncode == 0, f"--help failed:\n{out.stderr[-2000:]}"
    for option in {m for w in words for m in re.findall(r"(?<![\w-])--[a-z][\w-]*", w)}:
        assert option in out.stdout, f"{option} is not an option any more:\n{out.stdout}"


COMMANDS = commands()
SUBCOMMANDS = ("serve", "say", "models", "trace", "g2p", "ptt")


def test_the_docs_quote_commands():
    assert len(COMMANDS) > 30
    assert any(c.output for c in COMMANDS), "the g2p example with its output"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_doc_command(command: Command, tmp_path):
    action, why = rule_for(command)
    env, words = split_env(command.text)
    if action == "skip":
        for word in words:
            if re.match(r"(docker|configs|scripts)/", word):
                assert (ROOT / word.split(":")[0]).exists(), f"{command}: {word} does not exist"
        pytest.skip(why)
    if action == "make":
        target = words[1]
        out = run(["make", "-n", target], env)
        assert out.returncode == 0, f"{command}: make -n {target} failed:\n{out.stderr}"
        return
    if words[0].endswith("voxloop"):
        argv = voxloop(words)
        check_voxloop_config(words, env)
    elif words[:2] == ["python", "-m"]:
        argv = [sys.executable, *words[1:]]
    elif words[0] == "python":
        argv = [sys.executable, *words[1:]]
    else:
        argv = [str(ROOT / words[0]), *words[1:]]
    if action == "help":
        # the program up to its first option (and the subcommand of voxloop), then --help
        head = argv[: next((i for i, w in enumerate(argv) if i > 2 and (w.startswith("-") or SYNOPSIS.search(w))), len(argv))]
        if words[0].endswith("voxloop"):  # options before the subcommand are voxloop's own
            at = next((i for i, w in enumerate(words) if w in SUBCOMMANDS), len(words))
            help_names_options(voxloop(["voxloop"]), words[1:at], env)
            head, words = voxloop(["voxloop", *words[at : at + 1]]), words[at:]
        help_names_options(head, words, env)
        return
    out = run(argv, env, cwd=tmp_path if "say" in words else ROOT)
    assert out.returncode == 0, f"{command} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    if command.output:
        assert out.stdout.splitlines() == list(command.output), f"{command}: the doc shows other output"
    if "say" in words:
        assert (tmp_path / words[words.index("-o") + 1]).stat().st_size > 10_000
