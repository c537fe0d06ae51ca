"""Shared bits of the benchmarks: hardware description, percentiles, result files, a server process."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


def hardware_tag() -> str:
    """Short file-name-safe hardware name, e.g. ``intel-r-xeon-r-processor-2c``."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")
    return f"{slug[:40]}-{os.cpu_count()}c"


def hardware() -> dict[str, object]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine()}


def pct(values, q: float) -> float | None:
    """The q-th percentile of ``values`` (None when empty), rounded to 0.1."""
    if len(values) == 0:
        return None
    return round(float(np.percentile(np.asarray(values, dtype=float), q)), 1)


def result_path(name: str, ext: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}-{hardware_tag()}-{dt.date.today().isoformat()}.{ext}"


def write_json(name: str, rows: list[dict], extra: dict | None = None) -> Path:
    """``bench/results/<name>-<hardware>-<date>.json`` with rows plus date, hardware, command."""
    path = result_path(name, "json")
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        **(extra or {}),
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str], timeout_s: float = 120.0) -> subprocess.Popen:
    """``python -m voxloop [extra] --set trace.path=none serve --port PORT``, returned once /ready is 200.

    The server's log goes to a temporary file (a pipe nobody reads would fill and stall it);
    its tail is in the error when the server exits or is not ready within ``timeout_s``.
    """
    cmd = [sys.executable, "-m", "voxloop", *extra, "--set", "trace.path=none", "serve", "--port", str(port)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not ready within {timeout_s:g} s: {_tail(log)}")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGINT (the server drains and exits), then kill if it does not exit within ``timeout_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log, chars: int = 2000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-chars:]


def default_voice() -> str:
    """The bundled Piper voice's path (``voxloop.models``), for scripts run without ``--voice``."""
    from voxloop import models
    from voxloop.config import load_config

    return str(models.resolve_voice(load_config()).path)
