"""The whole voice loop through the load balancer: one level of talkers, and a replica killed mid-run.

``voice_level``: the talkers of bench.voice_latency (``bench.voice_talkers``) (client processes, real-time microphones, JSON or
binary audio, permessage-deflate offered) connect to ``topo.lb_url``; the row is voice_latency's
summary of the level plus each replica's figures (``bench.scaleout.replicas``) and how evenly
the sessions were split.

``voice_kill``: the same talkers, except that each one reconnects when its connection ends
(``RealtimeClient.reconnect()``, as a voxloop client does) and goes on with its next turn. Once
the replicas have finished ``kill_after_turns`` turns, the replica with the most sessions is
killed: ``kill``, SIGKILL to its process group (a crash: its front ends, engine and LLM
process die together), or ``term``, SIGTERM (a drain). Each talker records the replica of each
of its connections (HAProxy's ``X-Voxloop-Replica`` header), the close it saw, how long it took
to be connected again, and every turn. The row says whether only the victim's sessions were
closed, whether every one of them came back and was answered again, and how many turns the
other sessions missed (the goal: none).
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time

from bench.harness import Mic, counter_delta, pct, run_client_processes, scrape_metrics
from bench.scaleout.replicas import ReplicaWatch, split
from bench.scaleout.topology import Topology
from bench.voice_talkers import RATE, Level, offer_deflate, one_turn, run_level, summarize

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}
#: Seconds between a talker's reconnect attempts grow from this to 1 s (20 attempts).
RECONNECT_DELAY_S = 0.05


def voice_level(topo: Topology, speech: dict, talkers: int, turns: int, *, timeout_s: float = 30.0,
                binary: bool = False, per_process: int = 16, ramp_s: float | None = None) -> tuple[dict, list[dict]]:
    """One level through the balancer; (summary row with ``replicas`` and ``sessions_split``, turn rows)."""
    ramp = ramp_s if ramp_s is not None else max(2.0, 0.05 * talkers)
    level = Level(topo.lb_url, talkers, turns, timeout_s, binary, True, ramp)
    with ReplicaWatch(topo) as watch:
        rows, n_procs = run_level(level, speech, per_process)
    replicas = watch.report()
    row = summarize(talkers, rows)
    row.update(client_processes=n_procs, ramp_s=ramp, replicas=replicas,
               replicas_up=sum(r["answered"] for r in replicas), sessions_split=split(replicas))
    return row, rows


# ---------------------------------------------------------------- talkers that reconnect


def _replica(client) -> str | None:  # noqa: ANN001 - a connected RealtimeClient
    """The replica HAProxy sent this connection to (its ``X-Voxloop-Replica`` response header)."""
    headers = client.response_headers
    return headers.get("X-Voxloop-Replica") if headers is not None else None


async def _stop_mic(mic: Mic) -> None:
    try:
        await mic.stop()
    except Exception:  # noqa: BLE001 - its connection is gone: the send failed, nothing to stop
        pass


async def reconnecting_talker(level: Level, speech: dict, index: int, t0: float) -> dict:
    """Talker ``index``: its turns; on a closed connection, reconnect and go on with the next turn."""
    from base.errors import ConnectionFailed
    from voxloop.client import RealtimeClient, RetryPolicy

    rng = random.Random(index)
    order = list(speech)
    rng.shuffle(order)
    out: dict = {"session": index, "turns": [], "replicas": [], "closes": [], "reconnect_ms": [], "error": None}
    await asyncio.sleep(max(0.0, t0 + level.ramp_s * (index + rng.random()) / level.talkers - time.monotonic()))
    retry = RetryPolicy(attempts=20, initial_delay_s=RECONNECT_DELAY_S, max_delay_s=1.0)
    client = RealtimeClient(level.url, binary_audio=level.binary, retry=retry)
    mic = None
    try:
        await client.open()
        out["replicas"].append(_replica(client))
        mic = Mic(client, RATE)
        for n in range(level.turns):
            q = order[n % len(order)]
            try:
                row = await one_turn(client, mic, q, speech, rng, level.timeout_s)
            except ConnectionFailed as exc:  # closed while listening to the reply (x.playback failed)
                row = {"question": q, "missed": True, "why": f"ConnectionFailed: {exc}"[:200]}
            row.update(replica=out["replicas"][-1], closed=not client.connected)
            out["turns"].append(row)
            if client.connected:
                continue
            ended = client.ended
            out["closes"].append({"at": time.time(), "code": getattr(ended, "close_code", None) or 1006})
            await _stop_mic(mic)
            seen = time.monotonic()
            await client.reconnect()
            out["reconnect_ms"].append(round(1000 * (time.monotonic() - seen), 1))
            out["replicas"].append(_replica(client))
            mic = Mic(client, RATE)
    except Exception as exc:  # noqa: BLE001 - a bench records, it does not stop
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if mic is not None:
            await _stop_mic(mic)
        await client.close()
    return out


def _client_process(indices: list[int], level: Level, speech: dict, t0: float) -> list[dict]:
    """The reconnecting talkers ``indices`` of one client process (``run_client_processes``)."""
    if level.deflate:
        offer_deflate()

    async def main() -> list[dict]:
        return await asyncio.gather(*(reconnecting_talker(level, speech, i, t0) for i in indices))

    return asyncio.run(main())


class _Killer(threading.Thread):
    """Kills the busiest replica once the replicas together have finished ``after_turns`` turns."""

    def __init__(self, topo: Topology, mode: str, after_turns: int, timeout_s: float) -> None:
        super().__init__(name="replica-killer", daemon=True)
        self.topo, self.mode, self.after_turns, self.timeout_s = topo, mode, after_turns, timeout_s
        self.before = [self._turns(r.index) or 0.0 for r in topo.replicas]
        self.victim: int | None = None
        self.at: float | None = None  # time.time() of the kill
        self.sessions: list[int | None] = []
        self.stop = threading.Event()

    def _turns(self, index: int) -> float | None:
        try:
            samples = scrape_metrics(self.topo.metrics_url(index), timeout_s=5.0)
        except (OSError, ValueError):
            return None
        return sum(counter_delta({}, samples, "voxloop_turns_total", k) or 0.0
                   for k in samples.get("voxloop_turns_total", {}))

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.wait(0.5) and time.monotonic() < deadline:
            done = sum((self._turns(r.index) or 0.0) - b for r, b in zip(self.topo.replicas, self.before, strict=True))
            if done >= self.after_turns:
                self.sessions = [self.topo.sessions_active(r.index) for r in self.topo.replicas]
                self.victim = max(range(len(self.sessions)), key=lambda i: self.sessions[i] or 0)
                self.at = time.time()
                self.topo.kill(self.victim, SIGNALS[self.mode])
                return


def voice_kill(topo: Topology, speech: dict, talkers: int, turns: int, kill_after_turns: int, mode: str = "kill", *,
               timeout_s: float = 30.0, binary: bool = False, per_process: int = 16,
               ramp_s: float | None = None) -> tuple[dict, list[dict]]:
    """Talkers that reconnect; the busiest replica killed mid-run. (Summary row, one row per talker.)"""
    ramp = ramp_s if ramp_s is not None else max(2.0, 0.05 * talkers)
    level = Level(topo.lb_url, talkers, turns, timeout_s, binary, True, ramp)
    n_procs = min(talkers, -(-talkers // per_process))
    groups = [list(range(p, talkers, n_procs)) for p in range(n_procs)]
    turn_s = 1.0 + 10.0 + timeout_s + 60.0
    killer = _Killer(topo, mode, kill_after_turns, timeout_s=ramp + turns * turn_s)
    killer.start()
    try:
        results = run_client_processes(_client_process, groups, (level, speech), ramp + turns * turn_s + 60)
    finally:
        killer.stop.set()
        killer.join()
    sessions: list[dict] = []
    for group, (ok, payload) in zip(groups, results, strict=True):
        sessions += payload if ok else [{"session": i, "turns": [], "replicas": [], "closes": [], "reconnect_ms": [],
                                         "error": f"client process: {payload}"[:200]} for i in group]
    exit_code = None
    if killer.victim is not None:
        exit_code = topo.wait_exit(killer.victim, timeout_s=topo.grace_s + 30)
    row = summarize_kill(sessions, topo, killer, mode, exit_code)
    row["talkers"], row["turns_per_talker"], row["client_processes"] = talkers, turns, n_procs
    return row, sessions


def summarize_kill(sessions: list[dict], topo: Topology, killer: _Killer, mode: str, exit_code: int | None) -> dict:
    """Who was closed, who came back, who missed what (see the module docstring)."""
    victim = None if killer.victim is None else topo.replicas[killer.victim].name
    moved = [s for s in sessions if s["closes"]]
    stayed = [s for s in sessions if not s["closes"]]
    after_close = [t for s in moved for t in _after_close(s)]
    reconnect = [ms for s in moved for ms in s["reconnect_ms"]]
    answered = lambda ts: [t for t in ts if not t["missed"]]  # noqa: E731
    return {
        "mode": mode, "killed_replica": victim, "killed_exit_code": exit_code,
        "sessions_per_replica_at_kill": dict(zip((r.name for r in topo.replicas), killer.sessions, strict=False)),
        "moved_sessions": len(moved),
        "moved_first_on_victim": sum(1 for s in moved if s["replicas"][:1] == [victim]),
        "close_codes": sorted({c["code"] for s in moved for c in s["closes"]}),
        "moved_reconnected": sum(1 for s in moved if len(s["replicas"]) > len(s["closes"])),
        "moved_landed_on": sorted({r for s in moved for r in s["replicas"][1:] if r}),
        "reconnect_ms_p50": pct(reconnect, 50), "reconnect_ms_max": max(reconnect, default=None),
        "moved_turns_after_close": len(after_close),
        "moved_turns_after_close_missed": len(after_close) - len(answered(after_close)),
        "moved_served_after": sum(1 for s in moved if answered(_after_close(s))),
        "untouched_sessions": len(stayed),
        "untouched_on": sorted({r for s in stayed for r in s["replicas"] if r}),
        "untouched_turns": sum(len(s["turns"]) for s in stayed),
        "untouched_missed_turns": sum(1 for s in stayed for t in s["turns"] if t["missed"]),
        "untouched_missed_why": sorted({t.get("why", "")[:80] for s in stayed for t in s["turns"] if t["missed"]})[:5],
        "errors": [s["error"] for s in sessions if s["error"]][:5],
        "untouched_processing_p99_ms": pct([t["processing_ms"] for s in stayed for t in answered(s["turns"])
                                            if t.get("processing_ms") is not None], 99),
    }  # fmt: skip


def _after_close(session: dict) -> list[dict]:
    """The turns a moved talker took after its first closed one (on the replica it reconnected to)."""
    first = next(i for i, t in enumerate(session["turns"]) if t["closed"])
    return session["turns"][first + 1:]
