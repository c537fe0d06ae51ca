"""Scale-out benchmark: sessions spread over 2 replicas behind HAProxy; one replica dies.

Each of ``--sessions`` clients (``voxloop.client.RealtimeClient`` through the load
balancer) loops ``x.tts.speak`` of a short sentence with a short pause. After every
client has been served twice, the per-replica session counts are read from each
replica's ``/metrics``; then the busiest replica is killed (``kill``: SIGKILL, a crash;
``term``: SIGTERM, a drain). Its clients see the connection close (1006 for a crash,
no close frame possible; 1001 for a drain), reconnect through the balancer to the
survivor and go on. Measured: sessions per replica, reconnect time (close seen ->
new ``session.created``), requests and errors of the untouched sessions, speak latency
before/after. Loopback only; bounded in time.

    python -m bench.scaleout.run --sessions 12 --modes kill,term

Writes ``OUT/scaleout-<hardware>-<date>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass, field

from bench.harness import add_output_arguments, pct, write_json
from bench.scaleout.topology import Topology

SENTENCES = ("Hello there.", "The weather is nice today.", "Please hold the line.",
             "Your table is ready.", "Thanks for calling.")
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


@dataclass
class ClientLog:
    """What one client saw; times are ``time.monotonic()`` seconds."""

    index: int
    ok: list[tuple[float, float]] = field(default_factory=list)  # (done_at, latency_s)
    errors: list[str] = field(default_factory=list)
    closes: list[tuple[float, int]] = field(default_factory=list)  # (seen_at, close code)
    reconnects_s: list[float] = field(default_factory=list)


async def client_loop(url: str, log: ClientLog, stop: asyncio.Event, pause_s: float) -> None:
    from voxloop.client import RealtimeClient, RetryPolicy
    from base.errors import ConnectionFailed

    retry = RetryPolicy(attempts=20, initial_delay_s=0.05, max_delay_s=1.0)
    client = await RealtimeClient.connect(url, retry=retry)
    n = log.index
    try:
        while not stop.is_set():
            text = SENTENCES[n % len(SENTENCES)]
            n += 1
            t0 = time.monotonic()
            try:
                result = await client.speak(text, timeout_s=30)
            except ConnectionFailed as exc:
                seen = time.monotonic()
                log.closes.append((seen, exc.close_code or 1006))  # no close frame: 1006 (RFC 6455 7.1.5)
                try:
                    await client.reconnect()
                except Exception as exc2:  # noqa: BLE001 - recorded; the client is out
                    log.errors.append(f"reconnect failed: {type(exc2).__name__}: {exc2}")
                    return
                log.reconnects_s.append(time.monotonic() - seen)
                continue
            except Exception as exc:  # noqa: BLE001 - every failure is a data point here
                log.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if result.status != "completed" or len(result.pcm) == 0:
                log.errors.append(f"speak {result.status}, {len(result.pcm)} samples")
            else:
                log.ok.append((result.done_at, result.done_at - t0))
            await asyncio.sleep(pause_s)
    finally:
        await client.close()


async def scenario(topo: Topology, sessions: int, mode: str, after_s: float, pause_s: float,
                   warm_timeout_s: float = 60.0) -> dict:
    """One run: spread ``sessions``, kill the busiest replica with ``mode``, keep going ``after_s``."""
    logs = [ClientLog(i) for i in range(sessions)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(client_loop(topo.lb_url, log, stop, pause_s)) for log in logs]
    try:
        deadline = time.monotonic() + warm_timeout_s
        while min(len(log.ok) for log in logs) < 2:
            failed = [t for t in tasks if t.done()]
            if failed:
                failed[0].result()  # raises the client's error
            if time.monotonic() > deadline:
                raise TimeoutError("clients not all served twice during warm-up")
            await asyncio.sleep(0.1)
        per_replica = [topo.sessions_active(r.index) for r in topo.replicas]
        victim = max(range(len(per_replica)), key=lambda i: per_replica[i] or 0)
        t_kill = time.monotonic()
        topo.kill(victim, SIGNALS[mode])
        await asyncio.sleep(after_s)
        survivors_after = [topo.sessions_active(r.index) for r in topo.replicas]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    exit_code = topo.wait_exit(victim, timeout_s=topo.grace_s + 10)
    return summarize(logs, mode, per_replica, survivors_after, victim, t_kill, exit_code)


def summarize(logs: list[ClientLog], mode: str, per_replica: list, after: list, victim: int,
              t_kill: float, exit_code: int) -> dict:
    moved = [log for log in logs if log.closes]
    stayed = [log for log in logs if not log.closes]
    lat = lambda rows: [1000 * s for _, s in rows]  # noqa: E731
    before = [row for log in logs for row in log.ok if row[0] < t_kill]
    after_ok = [row for log in stayed for row in log.ok if row[0] >= t_kill]
    close_codes = sorted({code for log in moved for _, code in log.closes})
    reconnect_ms = [1000 * s for log in moved for s in log.reconnects_s]
    kill_to_served = [1000 * (min(t for t, _ in log.ok if t > log.closes[0][0]) - t_kill)
                      for log in moved if any(t > log.closes[0][0] for t, _ in log.ok)]
    return {
        "mode": mode,
        "sessions": len(logs),
        "sessions_per_replica_before": per_replica,
        "sessions_per_replica_after": after,
        "killed_replica": victim,
        "killed_exit_code": exit_code,
        "moved_sessions": len(moved),
        "close_codes": close_codes,
        "reconnect_ms_p50": pct(reconnect_ms, 50),
        "reconnect_ms_max": round(max(reconnect_ms), 1) if reconnect_ms else None,
        "kill_to_first_served_ms_p50": pct(kill_to_served, 50),
        "kill_to_first_served_ms_max": round(max(kill_to_served), 1) if kill_to_served else None,
        "moved_served_after": sum(1 for log in moved if any(t > log.closes[-1][0] for t, _ in log.ok)),
        "untouched_sessions": len(stayed),
        "untouched_closes": sum(len(log.closes) for log in stayed),
        "errors": sum(len(log.errors) for log in logs),
        "error_samples": [e for log in logs for e in log.errors][:5],
        "requests_ok": sum(len(log.ok) for log in logs),
        "untouched_requests_after_kill": len(after_ok),
        "speak_ms_p50_before": pct(lat(before), 50),
        "speak_ms_p99_before": pct(lat(before), 99),
        "untouched_speak_ms_p50_after": pct(lat(after_ok), 50),
        "untouched_speak_ms_p99_after": pct(lat(after_ok), 99),
    }


async def run(sessions: int, modes: list[str], after_s: float, pause_s: float,
              grace_s: float = 5.0) -> list[dict]:
    """Start the topology, run each mode (restarting the dead replica between), tear down."""
    topo = Topology(replicas=2, grace_s=grace_s)
    try:
        await asyncio.to_thread(topo.start)
        return await run_modes(topo, sessions, modes, after_s, pause_s)
    finally:
        await asyncio.to_thread(topo.close)


async def run_modes(topo: Topology, sessions: int, modes: list[str], after_s: float, pause_s: float) -> list[dict]:
    """Each mode on a running ``topo``; the killed replica is started again after each."""
    rows = []
    for mode in modes:
        row = await scenario(topo, sessions, mode, after_s, pause_s)
        rows.append(row)
        print(json.dumps(row), flush=True)
        await asyncio.to_thread(restart, topo, row["killed_replica"])
    return rows


def restart(topo: Topology, index: int, timeout_s: float = 180.0) -> None:
    """Start replica ``index`` again and wait until HAProxy sends it sessions."""
    topo.start_replica(index)
    topo.wait_ready([index], timeout_s)
    topo.wait_balanced([r.index for r in topo.replicas], timeout_s=10 * topo.check_ms / 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12, help="concurrent client sessions")
    ap.add_argument("--modes", default="kill,term", help="comma list of kill (SIGKILL), term (SIGTERM)")
    ap.add_argument("--after", type=float, default=6.0, help="seconds to keep going after the kill")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between a client's requests")
    ap.add_argument("--no-write", action="store_true", help="print only, no result file")
    add_output_arguments(ap)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    rows = asyncio.run(run(args.sessions, modes, args.after, args.pause))
    if not args.no_write:
        print(write_json("scaleout", rows, {"topology": "2 x voxloop serve + HAProxy (docker/haproxy-host.cfg: "
                                            "leastconn, httpchk /ready every 500 ms), loopback"}, out=args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
