"""Shared bits of the benchmarks: hardware description, percentiles, result files."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import sys
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
