"""Per-replica figures of a run through the load balancer: sessions, turns, GPU memory.

    with ReplicaWatch(topo) as watch:   # each replica's /metrics read before, sessions sampled during
        ...                             # drive talkers or TTS clients through topo.lb_url
    rows = watch.report()               # one row per replica, read after

Per replica: sessions it accepted over the run (``voxloop_sessions_total``, summed over a GPU
replica's front ends) and at most at once (``voxloop_sessions_active``, sampled), connections
HAProxy sent it (its stats), turns by outcome (``voxloop_turns_total``), and GPU memory: the
device's (``voxloop_gpu_device_used_bytes``: with one GPU per replica, that GPU), the TTS pool's,
the ASR's and the LLM's as the replica exports them, and what ``nvidia-smi`` counts for the
replica's processes on each GPU (which GPU a replica really runs on). None where a figure does not
exist (a CPU replica has no GPU memory; a replica that died answers nothing).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from bench.harness import Samples, counter_delta, gauge, scrape_metrics
from bench.scaleout.topology import Topology

MIB = 2**20


def scrape_or_none(url: str) -> Samples | None:
    try:
        return scrape_metrics(url, timeout_s=5.0)
    except (OSError, ValueError):
        return None


def gpu_processes() -> dict[int, dict[str, float]] | None:
    """``{pid: {gpu uuid: MiB}}`` of every process using a GPU (``nvidia-smi``); None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
                             check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    found: dict[int, dict[str, float]] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            try:
                found.setdefault(int(parts[0]), {})[parts[1]] = float(parts[2])
            except ValueError:  # "[N/A]" where the driver does not say
                continue
    return found


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (a GPU replica's engine, front-end and LLM processes), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone since the listing
    tree, grew = {pid}, True
    while grew:
        kids = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= kids
        grew = bool(kids)
    return tree


class ReplicaWatch:
    """Reads every replica of ``topo`` before and after a run and samples its sessions during it."""

    def __init__(self, topo: Topology, interval_s: float = 2.0) -> None:
        self.topo = topo
        self.interval_s = interval_s
        n = len(topo.replicas)
        self.before: list[Samples | None] = [None] * n
        self.after: list[Samples | None] = [None] * n
        self.lb_before: dict[str, int] = {}
        self.lb_after: dict[str, int] = {}
        self.peak: list[int | None] = [None] * n
        self.gpu: list[dict[str, float] | None] = [None] * n
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="replica-watch", daemon=True)

    def __enter__(self) -> ReplicaWatch:
        self.before = [scrape_or_none(self.topo.metrics_url(r.index)) for r in self.topo.replicas]
        self.lb_before = self.topo.lb_sessions()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.gpu = self._gpu_by_replica()
        self.after = [scrape_or_none(self.topo.metrics_url(r.index)) for r in self.topo.replicas]
        self.lb_after = self.topo.lb_sessions()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            for r in self.topo.replicas:
                n = self.topo.sessions_active(r.index)
                if n is not None:
                    self.peak[r.index] = max(n, self.peak[r.index] or 0)

    def _gpu_by_replica(self) -> list[dict[str, float] | None]:
        apps = gpu_processes()
        out: list[dict[str, float] | None] = []
        for r in self.topo.replicas:
            if apps is None or r.proc is None or r.proc.poll() is not None:
                out.append(None)
                continue
            mine: dict[str, float] = {}
            for pid in process_tree(r.proc.pid):
                for uuid, mib in apps.get(pid, {}).items():
                    mine[uuid] = mine.get(uuid, 0.0) + mib
            out.append(mine)
        return out

    def report(self) -> list[dict]:
        """One row per replica (see the module docstring); MiB for memory."""
        rows = []
        for r in self.topo.replicas:
            lb = self.lb_after.get(r.name)
            rows.append({
                "replica": r.name, "env": r.env, **replica_figures(self.before[r.index], self.after[r.index]),
                "sessions_peak": self.peak[r.index],
                "lb_connections": None if lb is None else lb - self.lb_before.get(r.name, 0),
                "gpu_processes_mib": self.gpu[r.index],
            })  # fmt: skip
        return rows


def replica_figures(before: Samples | None, after: Samples | None) -> dict:
    """What one replica's ``/metrics`` says of a run, from a read before and one after (None: no
    answer): ``answered``, sessions it accepted, turns by outcome, GPU and LLM memory (MiB)."""
    b, a = before or {}, after or {}
    turns = {"/".join(v for _, v in k): counter_delta(b, a, "voxloop_turns_total", k)
             for k in a.get("voxloop_turns_total", {})}
    return {
        "answered": after is not None,
        "sessions": counter_delta(b, a, "voxloop_sessions_total"),
        "turns": turns or None,
        "gpu_device_used_mib": gauge(a, "voxloop_gpu_device_used_bytes", MIB),
        "gpu_device_total_mib": gauge(a, "voxloop_gpu_device_total_bytes", MIB),
        "gpu_tts_pool_reserved_mib": _labelled(a, "voxloop_gpu_pool_bytes", {"kind": "reserved", "stat": "current"}),
        "asr_gpu_mib": gauge(a, "voxloop_asr_gpu_bytes", MIB),
        # Weights and KV cache: on the GPU with llm.n_gpu_layers, else in host memory.
        "llm_memory_mib": gauge(a, "voxloop_llm_memory_bytes", MIB),
    }  # fmt: skip


def _labelled(samples: Samples, name: str, labels: dict[str, str]) -> float | None:
    value = samples.get(name, {}).get(tuple(sorted(labels.items())))
    return None if value is None else round(value / MIB, 1)


def split(rows: list[dict], key: str = "sessions") -> float | None:
    """Largest relative distance of a replica's ``key`` from an even share (0.1: within ±10 %);
    None when a replica has no figure."""
    values = [r[key] for r in rows]
    if not values or any(v is None for v in values) or not sum(values):
        return None
    even = sum(values) / len(values)
    return round(max(abs(v - even) for v in values) / even, 3)
