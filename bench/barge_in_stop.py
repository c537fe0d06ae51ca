"""How fast speech stops when a client interrupts it, per ``server.audio_delta_ms``.

A client asks for a long ``x.tts.speak`` (JSON/base64 audio at 24 kHz, permessage-deflate offered,
as OpenAI-style clients do), plays it in real time, and after a random 0.3-1.5 s of playback
sends ``x.tts.cancel``, as a client does when its user starts talking. Per trial:

* ``stop_ms``: cancel sent -> ``x.tts.done`` (status cancelled) received;
* ``late_audio_ms``: audio in deltas that arrived after the cancel was sent (a client that
  drops audio after its cancel never plays it; one that does not would);
* ``buffered_ms``: audio received but not yet played when the cancel was sent: what a client
  must drop from its own playback buffer (the server sends faster than real time).

Each ``--delta-ms`` value gets its own server (``--set server.audio_delta_ms=...``), TTS only;
the runs alternate so machine load falls on both alike. Writes
bench/results/barge_in_stop-<hardware>-<date>.json (+ .png).

    python -m bench.barge_in_stop --delta-ms 100 200 --trials 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import time

from bench.harness import add_output_arguments, free_port, pct, start_server, stop_server, write_json

RATE = 24000
#: About a minute of speech: synthesis (faster than real time) must still be running at the cancel.
TEXT = " ".join(["Here is a long answer so that there is plenty of speech to interrupt. It goes on for a while, "
                 "clause after clause, the way an assistant explains something step by step. First this, then "
                 "that, and after that one more thing, until the listener has heard enough and says so."] * 5)


async def trial(url: str, seed: int) -> dict:
    import websockets

    rng = random.Random(seed)
    async with websockets.connect(url, max_size=None, compression="deflate", open_timeout=60) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": RATE}}}}}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "r", "text": TEXT}))
        received_ms = 0.0
        play_start = cancel_at = None
        listen_s = rng.uniform(0.3, 1.5)
        late_ms = buffered_ms = 0.0
        while True:
            timeout = None
            if cancel_at is None and play_start is not None:
                timeout = max(0.0, play_start + listen_s - time.monotonic())
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            except TimeoutError:
                cancel_at = time.monotonic()
                buffered_ms = received_ms - 1000 * (cancel_at - play_start)
                await ws.send(json.dumps({"type": "x.tts.cancel", "request_id": "r"}))
                continue
            if message["type"] == "x.tts.audio.delta":
                ms = 1000 * len(base64.b64decode(message["delta"])) / 2 / RATE
                received_ms += ms
                if play_start is None:
                    play_start = time.monotonic()
                if cancel_at is not None:
                    late_ms += ms
            elif message["type"] == "x.tts.done":
                if cancel_at is None:
                    raise RuntimeError("the speech ended before the cancel: make TEXT longer")
                assert message["status"] == "cancelled", message
                return {"stop_ms": 1000 * (time.monotonic() - cancel_at), "late_audio_ms": late_ms,
                        "buffered_ms": buffered_ms, "listened_s": listen_s}
            elif message["type"] == "error":
                raise RuntimeError(f"server error: {message}")


def summarize(delta_ms: int, trials: list[dict]) -> dict:
    row: dict = {"audio_delta_ms": delta_ms, "trials": len(trials)}
    for key in ("stop_ms", "late_audio_ms", "buffered_ms"):
        values = [t[key] for t in trials]
        row.update({f"{key}_p50": pct(values, 50), f"{key}_p90": pct(values, 90), f"{key}_max": max(values)})
    return row


def plot(rows: list[dict], raw: dict[int, list[dict]], path) -> None:  # noqa: ANN001
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, key, title in zip(axes, ("stop_ms", "late_audio_ms", "buffered_ms"),
                              ("cancel -> x.tts.done (ms)", "audio arriving after the cancel (ms)",
                               "received, not yet played at the cancel (ms)")):
        ax.boxplot([[t[key] for t in raw[r["audio_delta_ms"]]] for r in rows],
                   tick_labels=[f'{r["audio_delta_ms"]} ms deltas' for r in rows])
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delta-ms", type=int, nargs="+", default=[100, 200], help="server.audio_delta_ms values")
    p.add_argument("--trials", type=int, default=20, help="interruptions per value")
    p.add_argument("--server-arg", action="append", default=[], help="extra args before `serve`, e.g. --set=x.y=z")
    add_output_arguments(p)
    args = p.parse_args(argv)
    raw: dict[int, list[dict]] = {d: [] for d in args.delta_ms}
    servers = {}
    try:
        for d in args.delta_ms:
            port = free_port()
            servers[d] = (port, start_server(port, ["--set", "server.stages=tts", "--set",
                                                   f"server.audio_delta_ms={d}", *args.server_arg], timeout_s=300))
        for i in range(args.trials):  # alternate, so load on the machine falls on every value alike
            for d in args.delta_ms:
                raw[d].append(asyncio.run(trial(f"ws://127.0.0.1:{servers[d][0]}/v1/realtime", seed=i)))
    finally:
        for _, proc in servers.values():
            stop_server(proc)
    rows = [summarize(d, raw[d]) for d in args.delta_ms]
    for row in rows:
        print(json.dumps(row))
    path = write_json("barge_in_stop", rows, {"text_chars": len(TEXT), "rate": RATE, "raw": raw}, out=args.out)
    plot(rows, raw, path.with_suffix(".png"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
