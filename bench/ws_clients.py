"""Closed-loop ``x.tts.speak`` load over the WebSocket API, from several client processes.

What a user's clients do: each session connects as browsers and the ``openai``/``websockets``
clients do (permessage-deflate offered), asks for audio at ``--rate`` Hz, sends ``x.tts.speak``
with a ``request_id`` and the next sentence as soon as the previous one's ``x.tts.done``
arrives, and decodes every audio delta (JSON: parse + base64, with orjson and pybase64 as the
server writes them: one client process takes over twice the sentences it takes with the standard
library, ``--instant-server`` below; binary: the fast path negotiated with ``session.x_binary_audio``). Sessions are spread over ``--processes``
processes (spawned, so the client's own CPU does not share the server's event loop or one client
GIL). Each session stands for one user whose device decodes only its own audio: the sessions of
one process share its loop, so a burst of audio for many of them waits in that loop; fewer
sessions per process cut that wait (``--processes``).

Per request: first audio (send -> first audio delta), the server's share of it (``x.tts.done``
``first_audio_ms``) and sentence latency (send -> x.tts.done),
ms. Requests started before ``--warmup`` seconds are not counted. Used by
``python -m bench.tts_load --mode ws``; runnable alone::

    python -m bench.ws_clients --url ws://127.0.0.1:8765/v1/realtime --clients 50 --duration 20

The clients' own ceiling (a stand-in server in a process of its own answers every sentence at
once; each ``--decoder`` in turn, written to ``OUT/ws_clients-<hardware>-<date>.json``
and a PNG)::

    python -m bench.ws_clients --instant-server --clients 12 --processes 1 --duration 5 \
        --decoder json+base64 orjson+pybase64 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pybase64

from bench.harness import add_common_arguments, pyplot, result_path, write_json


def _orjson_pybase64(text: str) -> tuple[dict, bytes]:
    m = orjson.loads(text)
    return m, pybase64.b64decode(m["delta"], validate=True) if "delta" in m else b""


def _json_base64(text: str) -> tuple[dict, bytes]:
    m = json.loads(text)
    return m, base64.b64decode(m["delta"], validate=True) if "delta" in m else b""


#: How the clients parse a JSON message into (event, PCM bytes of its delta) (``--decoder``; each row
#: says which as ``client_decoder``; rows before it was recorded used json + base64). Both decode
#: every delta.
DECODERS = {"orjson+pybase64": _orjson_pybase64, "json+base64": _json_base64}
CLIENT_DECODER = "orjson+pybase64"

#: Client sessions per client process unless told otherwise (each process one asyncio loop).
SESSIONS_PER_PROCESS = 16

SENTENCES = Path(__file__).resolve().parent / "tts_sentences.json"


def load_texts() -> list[str]:
    return [s["text"] for s in json.loads(SENTENCES.read_text())["sentences"]]


async def _session(url: str, index: int, texts: list[str], fmt: str, rate: int, t_measure: float, t_end: float,
                   records: list, decoder: str = CLIENT_DECODER, voice: str | None = None) -> None:
    import websockets

    decode = DECODERS[decoder]

    async with websockets.connect(url, max_size=None, compression="deflate", open_timeout=60) as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        session: dict = {"audio": {"output": {"format": {"type": "audio/pcm", "rate": rate}}}}
        if voice is not None:  # x.tts.speak speaks in the session's voice
            session["audio"]["output"]["voice"] = voice
        if fmt == "binary":
            session["x_binary_audio"] = True
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while (m := json.loads(await ws.recv()))["type"] != "session.updated":
            if m["type"] == "error":
                raise RuntimeError(f"session.update refused: {m}")
        k = 0
        while time.time() < t_end:
            text = texts[(index * 13 + k) % len(texts)]
            rid = f"s{index}-{k}"
            k += 1
            t0 = time.time()
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": rid, "text": text}))
            first, samples = None, 0
            while True:
                message = await ws.recv()
                if isinstance(message, bytes):  # binary audio: [u16 n][n bytes header][PCM16]
                    n = int.from_bytes(message[:2], "little")
                    samples += (len(message) - 2 - n) // 2
                    first = first or time.time()
                    continue
                m, pcm = decode(message)
                kind = m["type"]
                if kind == "x.tts.audio.delta":
                    samples += len(pcm) // 2
                    first = first or time.time()
                elif kind == "x.tts.done" and m["request_id"] == rid:
                    break
                elif kind == "error":
                    raise RuntimeError(f"server error: {m}")
            t1 = time.time()
            if m["status"] != "completed" or not samples:
                raise RuntimeError(f"x.tts.speak ended {m['status']} with {samples} samples")
            if t0 >= t_measure:
                server_first = m.get("first_audio_ms")  # the server's share of the first audio
                records.append((t0, t1, (first or t1) - t0, t1 - t0, samples / rate,
                                np.nan if server_first is None else server_first / 1000))


def _process(url: str, indices: list[int], fmt: str, rate: int, t_measure: float, t_end: float, out,
             decoder: str, voice: str | None = None) -> None:
    texts = load_texts()
    records: list = []

    async def main() -> None:
        await asyncio.gather(*(_session(url, i, texts, fmt, rate, t_measure, t_end, records, decoder, voice)
                               for i in indices))

    try:
        asyncio.run(main())
        out.put(("ok", records))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def run_load(url: str, clients: int, duration_s: float, warmup_s: float, fmt: str = "json", rate: int = 24000,
             processes: int | None = None, connect_s: float = 10.0, decoder: str = CLIENT_DECODER,
             on_window: Callable[[float, float], None] | None = None, voice: str | None = None) -> dict:
    """Run the load; returns a row of figures (ms, QPS) with ``client_processes``, ``audio_format`` and
    ``client_decoder`` (``DECODERS``). ``on_window(t_measure, t_end)`` (``time.time()`` seconds) is
    called once the client processes are started, before the measured window opens. ``voice``: a
    name of the server's ``tts.voices`` (None: its default voice)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    processes = processes or max(1, -(-clients // SESSIONS_PER_PROCESS))
    processes = min(processes, clients)
    t_start = time.time() + connect_s  # sessions connect first; the clock starts together
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process, args=(url, list(range(p, clients, processes)), fmt, rate,
                                                t_measure, t_end, out, decoder, voice), daemon=True)
             for p in range(processes)]
    for p in procs:
        p.start()
    if on_window is not None:
        on_window(t_measure, t_end)
    records, errors = [], []
    for _ in procs:
        status, payload = out.get(timeout=connect_s + warmup_s + duration_s + 300)
        (records.extend if status == "ok" else errors.append)(payload)
    for p in procs:
        p.join(10)
    row = summarize(records, t_measure, t_end)
    row.update({"mode": "ws", "audio_format": f"{fmt}/{'base64' if fmt == 'json' else 'pcm16'}@{rate}",
                "permessage_deflate_offered": True, "concurrency": clients, "client_processes": processes,
                "client_decoder": decoder, "voice": voice or "default", "errors": len(errors),
                "error_examples": errors[:3]})
    return row


def summarize(records: list, t_measure: float, t_end: float) -> dict:
    """QPS over the measured window (requests that started in it) and latency percentiles, ms."""
    if not records:
        return {"requests": 0, "qps": 0.0}
    arr = np.array(records)
    elapsed = max(arr[:, 1].max(), t_end) - t_measure
    first, lat, audio = arr[:, 2] * 1000, arr[:, 3] * 1000, arr[:, 4]
    server = arr[:, 5] * 1000
    server = server[~np.isnan(server)]  # requests whose x.tts.done had no first_audio_ms
    return {
        "requests": len(arr), "qps": round(len(arr) / elapsed, 2),
        "audio_seconds_per_second": round(float(audio.sum()) / elapsed, 1),
        "audio_s_per_request": round(float(audio.mean()), 3),
        "first_audio_p50_ms": round(float(np.percentile(first, 50)), 2),
        "first_audio_p99_ms": round(float(np.percentile(first, 99)), 2),
        "latency_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 2),
        # x.tts.done's first_audio_ms: request received -> first delta queued, inside the server
        "server_first_audio_p50_ms": round(float(np.percentile(server, 50)), 2) if len(server) else None,
        "server_first_audio_p99_ms": round(float(np.percentile(server, 99)), 2) if len(server) else None,
        "elapsed_s": round(elapsed, 2),
    }  # fmt: skip


#: The stand-in server's answer to each ``x.tts.speak``: this many 200 ms deltas (4 s: the bench
#: sentences' mean audio).
INSTANT_DELTAS = 20


def _instant_server(port_out, rate: int, deltas: int) -> None:
    """A stand-in for ``voxloop serve`` that answers each ``x.tts.speak`` at once with ``deltas``
    JSON/base64 deltas of 200 ms of noise at ``rate`` Hz and ``x.tts.done``: what is left to measure
    is the clients' own ceiling (and this loop's). Puts its port on ``port_out``. It declines
    permessage-deflate; voxloop accepts it but sends audio uncompressed, the same bytes to decode."""
    import websockets

    pcm = np.random.default_rng(0).integers(-8000, 8000, rate // 5, dtype=np.int16).tobytes()
    b64 = pybase64.b64encode(pcm).decode("ascii")

    async def handler(ws) -> None:  # noqa: ANN001 - a websockets ServerConnection
        await ws.send(orjson.dumps({"type": "session.created"}).decode())
        async for text in ws:
            m = orjson.loads(text)
            if m["type"] == "session.update":
                await ws.send(orjson.dumps({"type": "session.updated"}).decode())
            elif m["type"] == "x.tts.speak":
                rid = m["request_id"]
                delta = orjson.dumps({"type": "x.tts.audio.delta", "request_id": rid, "delta": b64}).decode()
                for _ in range(deltas):
                    await ws.send(delta)
                await ws.send(orjson.dumps({"type": "x.tts.done", "request_id": rid, "status": "completed"}).decode())

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0, max_size=None, compression=None) as server:
            port_out.put(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    asyncio.run(main())


def client_ceiling(clients: int, processes: int, decoders: list[str], repeats: int, duration_s: float,
                   warmup_s: float, rate: int = 24000, deltas: int = INSTANT_DELTAS) -> list[dict]:
    """The clients' own ceiling: ``run_load`` against ``_instant_server`` (a process of its own), once
    per decoder per repeat, decoders alternating; one row each (``decoder``, ``repeat``)."""
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    server = ctx.Process(target=_instant_server, args=(ports, rate, deltas), daemon=True)
    server.start()
    rows = []
    try:
        url = f"ws://127.0.0.1:{ports.get(timeout=60)}"
        for repeat in range(repeats):
            for decoder in decoders:
                row = run_load(url, clients, duration_s, warmup_s, "json", rate, processes, connect_s=3.0,
                               decoder=decoder)  # fmt: skip
                rows.append({"repeat": repeat, "deltas_per_request": deltas, **row})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        server.kill()
    return rows


def plot(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    labels = [f"{r['client_decoder']}\nrun {r['repeat'] + 1}" for r in rows]
    colors = ["tab:blue" if r["client_decoder"] == CLIENT_DECODER else "tab:gray" for r in rows]
    ax.bar(range(len(rows)), [r["qps"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("sentences / s")
    r = rows[0]
    ax.set_title(f"Load clients alone: {r['concurrency']} sessions in {r['client_processes']} process(es), "
                 f"{r['deltas_per_request']} x 200 ms JSON deltas each", fontsize=9)  # fmt: skip
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=110)
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="ws://host:port/v1/realtime of a running server")
    ap.add_argument("--instant-server", action="store_true",
                    help="instead of --url: a stand-in server that answers at once (the clients' own ceiling), "
                         "every --decoder in turn, written to --out")
    ap.add_argument("--clients", type=int, default=8, help="concurrent sessions")
    ap.add_argument("--processes", type=int, default=None, help="client processes (default: 1 per 16 sessions)")
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    ap.add_argument("--format", choices=("json", "binary"), default="json", help="audio as JSON/base64 or binary")
    ap.add_argument("--rate", type=int, default=24000, help="output sample rate asked for, Hz")
    ap.add_argument("--voice-name", help="a voice of the server's tts.voices (default: its own voice)")
    ap.add_argument("--decoder", nargs="+", choices=tuple(DECODERS), default=[CLIENT_DECODER],
                    help="how clients parse JSON deltas (several: --instant-server only)")
    ap.add_argument("--repeats", type=int, default=2, help="--instant-server: runs per decoder")
    add_common_arguments(ap)
    args = ap.parse_args(argv)
    if args.instant_server:
        rows = client_ceiling(args.clients, args.processes or 1, args.decoder, args.repeats, args.duration,
                              args.warmup, args.rate)  # fmt: skip
        path = write_json("ws_clients", rows, path=result_path("ws_clients", "json", args.out, args.hardware,
                                                               args.date))  # fmt: skip
        print(f"wrote {path} and {plot(rows, path)}")
        return 1 if any(r["errors"] for r in rows) else 0
    if not args.url or len(args.decoder) > 1:
        ap.error("--url (or --instant-server) is required; one --decoder with --url")
    row = run_load(args.url, args.clients, args.duration, args.warmup, args.format, args.rate, args.processes,
                   decoder=args.decoder[0], voice=args.voice_name)  # fmt: skip
    json.dump(row, sys.stdout, indent=1)
    print()
    return 1 if row["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
