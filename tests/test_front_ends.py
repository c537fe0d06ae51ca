"""``server.front_ends = 2``: two WebSocket front-end processes on one port and one engine process.

The engine is the batching GPU engine run on the CPU (``tts.device = "cpu"``, no CUDA graphs), so
the whole process model runs as on a GPU host: front ends phonemize, resample and serialize; the
engine process batches every front end's requests and returns each step in one message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import websockets

from conftest import scaled

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600)),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT front ends need Linux")]
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


@pytest.fixture()
def server():
    port = _free_port()
    cmd = [sys.executable, "-m", "voxloop", "--set", "server.front_ends=2", "--set", "server.stages=tts",
           "--set", "tts.backend=cuda", "--set", "tts.device=cpu", "--set", "tts.cuda_graphs=false",
           "--set", "tts.max_batch=8", "--set", "limits.max_sessions=5", "--set", "trace.path=none",
           "--set", "server.shutdown_grace_s=5", "serve", "--port", str(port)]
    log = open(os.devnull, "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + scaled(240)
    while _get(port, "/ready")[0] != 200:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.5)
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _front_end_of(fronts: list[psutil.Process], client_port: int) -> int:
    """Which front-end process holds the server side of the connection from ``client_port``."""
    for i, p in enumerate(fronts):
        if any(c.raddr and c.raddr.port == client_port for c in p.net_connections("tcp")):
            return i
    raise AssertionError(f"no front end holds the connection from port {client_port}")


async def _speak(ws, rid: str) -> int:
    await ws.send(json.dumps({"type": "x.tts.speak", "request_id": rid, "text": "Hello from a front end. Two sentences."}))
    samples = 0
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), scaled(120)))
        assert m["type"] != "error", m
        if m["type"] == "x.tts.audio.delta":
            samples += len(base64.b64decode(m["delta"])) // 2
        elif m["type"] == "x.tts.done":
            assert m["status"] == "completed", m
            return samples


async def test_two_front_ends_share_one_engine_limits_metrics_and_drain(server):
    proc, port = server
    # The front ends are the spawned children (multiprocessing also starts its resource tracker).
    fronts = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(fronts) == 2
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    conns, served_by = [], set()
    # The kernel picks the front end per connection: keep one session on each front end (closing
    # extra ones on a front end already covered; 40 tries leave odds of 2**-39 to miss one).
    for _ in range(40):
        ws = await websockets.connect(url)  # offers permessage-deflate, like browsers
        assert json.loads(await ws.recv())["type"] == "session.created"
        front = _front_end_of(fronts, ws.local_address[1])
        if front in served_by:
            await ws.close()
            continue
        conns.append(ws)
        served_by.add(front)
        if len(served_by) == 2:
            break
    assert served_by == {0, 1}
    try:
        samples = await asyncio.gather(*(_speak(ws, f"r{i}") for i, ws in enumerate(conns)))
        assert all(s > 24000 for s in samples)
        # One counter for both processes: fill the 5 slots, the next upgrade is refused.
        while len(conns) < 5:
            conns.append(await websockets.connect(url))
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url)
        assert refused.value.response.status_code == 503
        status, metrics = await asyncio.to_thread(_get, port, "/metrics")
        assert status == 200
        assert re.search(r"^voxloop_sessions_active 5\.0$", metrics, re.M), "sessions not summed over front ends"
        audio = float(re.search(r'^voxloop_messages_sent_total\{kind="audio"\} (\S+)$', metrics, re.M).group(1))
        assert audio >= len(samples)  # every front end's deltas, whichever front end was scraped
        assert 'voxloop_stage_queue_depth{stage="tts_gpu"}' in metrics  # the engine process's scheduler
        # SIGTERM: the front ends drain and close sessions with 1001, the engine process exits 0.
        proc.send_signal(signal.SIGTERM)
        for ws in conns:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:  # events still queued (session.created of the last sessions), then the close
                    await asyncio.wait_for(ws.recv(), scaled(30))
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.to_thread(proc.wait, scaled(60)) == 0
    finally:
        for ws in conns:
            await ws.close()
