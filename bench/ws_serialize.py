"""Per-message cost on the server's hot path: serializing events and permessage-deflate.

For audio deltas (JSON/base64 and binary, 100 and 200 ms at 24 kHz of real speech from the bundled
voice) and for the text events of a typical voice turn, measures on this machine, per message:

* serialization: the generic codec (``realtime.events.serialize``, what audio used before) vs the
  fast path (``realtime.protocol.RealtimeProtocol.send``: an orjson header with pybase64's base64
  spliced in), the same splice with the standard library's base64 (``binascii``, what the fast
  path used until 2026-12-04), and orjson and msgspec encoding the whole event dict (pybase64 for
  both; msgspec comes with the ``dev`` extra for this comparison only);
* permessage-deflate as websockets' server negotiates it by default (window 2^12, memLevel 5,
  context kept): µs per message and the compressed size / original size.

From these it derives the CPU that deflating audio cost per second of speech sent, which is what
the server now skips (``pipeline/deflate.py``), and what compressing the text events costs and saves.
Writes ``OUT/ws_serialize-<hardware>-<date>.json`` and a PNG::

    python -m bench.ws_serialize
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np

from bench.harness import add_common_arguments, common_arguments, pyplot, report, save_png


def _speech(seconds: float = 4.0) -> np.ndarray:
    """Real speech at 24 kHz (the bundled voice, resampled as the server does)."""
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.engine import SynthesisOptions
    from base.config import load_config

    engine = OnnxTtsEngine.from_config(load_config(None, [], environ={}))
    text = "The weather should clear up by the afternoon, so we can go for a long walk by the lake."
    pcm = np.concatenate([c.pcm for c in engine.synthesize(text, SynthesisOptions(sample_rate=24000))])
    return pcm[: int(seconds * 24000)]


def _turn_events() -> list:
    """The text events of one voice turn with a two-sentence reply (as the server sends them)."""
    from realtime import events as ev
    from realtime.items import ContentPart, MessageItem
    from realtime.session_schema import SessionConfig

    ids = {"response_id": "resp_0123456789abcdef0123", "item_id": "item_0123456789abcdef0123"}
    item = MessageItem(id=ids["item_id"], role="assistant", status="completed", object="realtime.item",
                       content=(ContentPart(type="output_audio", transcript="Sure. It is sunny today."),))
    return [
        ev.SessionCreated(session=SessionConfig()),
        ev.InputAudioBufferSpeechStarted(audio_start_ms=1200, item_id="item_u"),
        ev.ResponseOutputAudioTranscriptDelta(**ids, delta="Sure."),
        ev.ResponseOutputAudioTranscriptDelta(**ids, delta=" It is sunny today."),
        ev.ResponseOutputAudioDone(**ids),
        ev.ResponseOutputItemDone(response_id=ids["response_id"], item=item),
    ]


def _time(fn, repeat: int) -> float:
    """Median µs of ``fn()`` over ``repeat`` calls (in 5 batches)."""
    per = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        per.append((time.perf_counter() - t0) / repeat * 1e6)
    return float(np.median(per))


def _library_us(events: list, repeat: int) -> dict[str, float]:
    """µs per audio delta: the fast path's splice with the standard library's base64, and orjson and
    msgspec building the same JSON text (base64 by pybase64, as the server's)."""
    import binascii

    import orjson
    from msgspec import json as msgspec_json

    from realtime.protocol import audio_header
    from realtime.wire import encode_pcm16, pcm16_bytes

    def stdlib(e) -> str:  # noqa: ANN001 - the fast path as it was, base64 by binascii
        audio = binascii.b2a_base64(pcm16_bytes(e.pcm), newline=False).decode("ascii")
        return f'{audio_header(e)[:-1].decode()},"delta":"{audio}"}}'

    def as_dict(e) -> dict:  # noqa: ANN001
        return {"type": e.type, "request_id": e.request_id, "delta": encode_pcm16(e.pcm)}

    encoder = msgspec_json.Encoder()

    def us(fn) -> float:  # noqa: ANN001
        return round(_time(lambda: [fn(e) for e in events], repeat) / len(events), 1)

    return {"stdlib_base64_serialize_us": us(stdlib), "orjson_serialize_us": us(lambda e: orjson.dumps(as_dict(e))),
            "msgspec_serialize_us": us(lambda e: encoder.encode(as_dict(e)))}


def _deflate(frames: list[bytes], repeat: int) -> tuple[float, float]:
    """µs per message and compressed/original size, websockets' server settings, context kept."""
    def run() -> int:
        enc = zlib.compressobj(wbits=-12, memLevel=5)
        return sum(len(enc.compress(f) + enc.flush(zlib.Z_SYNC_FLUSH)) - 4 for f in frames)

    size = run()
    us = _time(run, repeat) / len(frames)
    return us, size / sum(len(f) for f in frames)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed passes per measurement")
    add_common_arguments(ap)
    args = common_arguments(ap.parse_args(argv))
    from realtime import events as ev
    from realtime.events import serialize
    from realtime.protocol import RealtimeProtocol
    from realtime.session_schema import SessionConfig

    pcm = _speech()
    json_proto = RealtimeProtocol()
    binary_proto = RealtimeProtocol(session=SessionConfig(x_binary_audio=True))
    rows = []
    for delta_ms in (100, 200):
        step = 24000 * delta_ms // 1000
        events = [ev.XTtsAudioDelta(request_id="tts_1", pcm=pcm[i:i + step]) for i in range(0, len(pcm) - step + 1, step)]
        per_second = 1000 / delta_ms
        for fmt, proto in (("json", json_proto), ("binary", binary_proto)):
            frames = [proto.send(e) for e in events]
            raw = [f.encode() if isinstance(f, str) else f for f in frames]
            codec_us = _time(lambda: [serialize(e) for e in events], args.repeat) / len(events) if fmt == "json" else None
            fast_us = _time(lambda p=proto: [p.send(e) for e in events], args.repeat) / len(events)
            deflate_us, ratio = _deflate(raw, args.repeat)
            libs = _library_us(events, args.repeat) if fmt == "json" else {}
            rows.append({"message": f"audio delta {delta_ms} ms @24 kHz", "format": fmt, "bytes": len(raw[0]),
                         "codec_serialize_us": None if codec_us is None else round(codec_us, 1),
                         "serialize_us": round(fast_us, 1), **libs, "deflate_us": round(deflate_us, 1),
                         "deflated_size_ratio": round(ratio, 3),
                         "deflate_cpu_ms_per_audio_second": round(deflate_us * per_second / 1000, 3)})
    text = [serialize(e).encode() for e in _turn_events()]
    deflate_us, ratio = _deflate(text, args.repeat * 50)
    rows.append({"message": "text events of one voice turn", "format": "json", "count": len(text),
                 "bytes": sum(len(t) for t in text), "deflate_us": round(deflate_us, 1),
                 "deflated_size_ratio": round(ratio, 3)})
    report("ws_serialize", rows, {"note": "µs per message on this machine, median of 5 batches"}, args, _plot)
    return 0


def _plot(rows: list[dict], path) -> None:  # noqa: ANN001
    plt = pyplot()
    labels = [f"{r['message']}\n{r['format']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    axes[0].barh(labels, [r["deflate_us"] for r in rows], label="deflate")
    axes[0].barh(labels, [r.get("serialize_us") or 0 for r in rows], left=[r["deflate_us"] for r in rows],
                 label="serialize (fast path)")
    axes[0].set_xlabel("µs per message")
    axes[0].legend()
    axes[1].barh(labels, [r["deflated_size_ratio"] for r in rows])
    axes[1].set_xlabel("deflated size / original size")
    for ax in axes:
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"WebSocket per-message cost, {path.stem}")
    save_png(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
