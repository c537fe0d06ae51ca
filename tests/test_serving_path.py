"""The serving path at scale: bulk hand-off from the batching TTS engine, audio never deflated,
cheap event ids and audio frames, load metrics.

The batching engine is the real GPU engine (PyTorch VITS + continuous-batching scheduler) run on
the CPU with the bundled voice; the server is a real hub on port 0 and the clients real
``websockets`` clients that offer permessage-deflate, as browsers and the openai SDK do.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import re

import numpy as np
import pytest
import websockets
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory, PerMessageDeflate

from conftest import scaled
from realtime import events as ev
from realtime.events import serialize
from realtime.protocol import encode_audio_frame, encode_audio_json, parse_server_frame
from realtime.wire import new_id
from rt import http_get, url

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(scaled(300))

SENTENCES = "The quick brown fox jumps over the lazy dog. It was not amused at all."


# --------------------------------------------------------------------------- pure parts
def test_last_audio_parts_share_the_first_audios_way_in(monkeypatch):
    """The last audio's parts: the first audio's way in (text, to the engine), the engine from when
    it had the request to its last chunk, back to the front end and out; they add up to the request's
    start to its last delta queued. Without a last chunk (cancelled) there are none."""
    from pipeline import speech

    clock = iter([100.0, 100.001, 100.0045, 100.005, 100.0106])  # init, text, from_engine, out, last arrives
    monkeypatch.setattr(speech.time, "monotonic", lambda: next(clock))
    timing = speech.FirstAudioTiming()
    timing.mark("text")
    timing.mark("to_engine", 100.0015)  # the engine process's stamp
    timing.mark("engine", 100.004)
    timing.mark("from_engine")
    timing.mark("out")
    assert timing.last_parts(100.006) is None  # no last chunk stamped
    timing.last_chunk(100.010)
    last = timing.last_parts(100.011)
    assert list(last) == list(speech.LAST_AUDIO_PARTS)
    expected = {"text": 0.001, "to_engine": 0.0005, "engine": 0.0085, "from_engine": 0.0006, "out": 0.0004}
    assert last == pytest.approx(expected)
    assert sum(last.values()) == pytest.approx(100.011 - 100.0)
    assert {p: last[p] for p in ("text", "to_engine")} == {p: timing.parts[p] for p in ("text", "to_engine")}

    # one process: no link, the engine's part runs from the text's mark
    clock = iter([200.0, 200.002, 200.0061, 200.0062])
    monkeypatch.setattr(speech.time, "monotonic", lambda: next(clock))
    timing = speech.FirstAudioTiming()
    timing.mark("text")
    timing.mark("engine", 200.005)
    timing.mark("from_engine")
    timing.last_chunk(200.006)
    assert timing.last_parts(200.007) == pytest.approx({"text": 0.002, "engine": 0.004, "from_engine": 0.0002,
                                                        "out": 0.0008})


def test_event_ids_are_unique_and_shaped_like_before():
    ids = [new_id("event") for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"event_[0-9a-f]{20}", i) for i in ids[:: 997])


@pytest.mark.parametrize("binary", [False, True])
def test_audio_fast_path_has_the_codec_wire_form(binary):
    pcm = (np.arange(2400, dtype=np.int64) * 37 % 65536 - 32768).astype(np.int16)
    events = [
        ev.XTtsAudioDelta(request_id='odd "id" \\ é', pcm=pcm),
        ev.ResponseOutputAudioDelta(response_id="resp_1", item_id="item_2", output_index=1, content_index=0, pcm=pcm),
    ]
    for event in events:
        frame = encode_audio_frame(event) if binary else encode_audio_json(event)
        assert parse_server_frame(frame) == event
        if not binary:
            assert json.loads(frame) == json.loads(serialize(event))
            assert frame.startswith('{"type":"' + event.type + '"')


# --------------------------------------------------------------------------- served
class _RecordingDeflate(PerMessageDeflate):
    """Client side of permessage-deflate that notes, per received message, (opcode, RSV1)."""

    seen: list[tuple[int, bool]]

    def decode(self, frame, *, max_size=None):
        self.seen.append((int(frame.opcode), bool(frame.rsv1)))
        return super().decode(frame, max_size=max_size)


class _RecordingFactory(ClientPerMessageDeflateFactory):
    def __init__(self, seen: list) -> None:
        super().__init__(client_max_window_bits=True)  # what the websockets client offers by default
        self.seen = seen

    def process_response_params(self, params, accepted_extensions):
        ext = super().process_response_params(params, accepted_extensions)
        rec = _RecordingDeflate(ext.remote_no_context_takeover, ext.local_no_context_takeover,
                                ext.remote_max_window_bits, ext.local_max_window_bits, ext.compress_settings)
        rec.seen = self.seen
        return rec


@pytest.fixture(scope="module")
def batching_engine(cfg):
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base import models

    torch.set_num_threads(2)
    # The engine delivers the sessions' 24 kHz (resampled in its decoder steps, as configs/gpu.toml does).
    options = RunnerOptions(chunk_frames=32, max_frames=1024, decode_batches=(1, 2, 4, 8),
                            encode_batches=(1, 2, 4, 8), phoneme_buckets=(64, 128), cuda_graphs=False,
                            output_rate=24000)  # fmt: skip
    engine = CudaTtsEngine(Voice.load(models.resolve_voice(cfg).path), options, device="cpu")
    assert engine.sample_rate == 24000
    yield engine
    engine.close()


def test_first_chunks_reach_the_sink_before_the_step_decodes_the_rest(cfg):
    """A request joining running ones gets its first chunk handed out as soon as that chunk is
    decoded, not after the longer chunks of the others in the same step."""
    import threading
    import time

    from tts_engine.engine import AudioChunk, SynthesisOptions
    from tts_engine.torch_vits.cuda_engine import CudaTtsEngine
    from tts_engine.torch_vits.runner import RunnerOptions
    from tts_engine.voice import Voice
    from base import models

    # First chunks of 32 frames, later ones of up to 128: two groups in one step.
    options = RunnerOptions(chunk_frames=32, tail_chunk_frames=128, max_frames=1024, decode_batches=(1, 2),
                            encode_batches=(1, 2), phoneme_buckets=(64, 128), cuda_graphs=False)
    engine = CudaTtsEngine(Voice.load(models.resolve_voice(cfg).path), options, device="cpu")
    log: list[tuple] = []
    lock = threading.Lock()

    def sink(outcomes):
        with lock:
            log.append(("sink", [(r, o.final) for r, o in outcomes if isinstance(o, AudioChunk)]))

    decode = engine.scheduler.runner.decode

    def logged_decode(slots, starts, size, lane="main"):
        with lock:
            log.append(("decode", size, list(starts)))
        return decode(slots, starts, size, lane)

    def wait_for(request, final: bool) -> None:
        deadline = time.monotonic() + scaled(60)
        while not any(e[0] == "sink" and any(r is request and (f or not final) for r, f in e[1]) for e in list(log)):
            assert time.monotonic() < deadline, "no chunk came"
            time.sleep(0.005)

    engine.scheduler.runner.decode = logged_decode
    try:
        slow = SynthesisOptions(length_scale=2.5)  # a long clause: it keeps running for several steps
        (running,), _ = engine.submit_sentences(engine.sentence_ids("The quick brown fox jumps over the lazy dog."),
                                                slow, sink=sink)
        wait_for(running, final=False)
        (joining,), _ = engine.submit_sentences(engine.sentence_ids("It was not amused."), None, sink=sink)
        wait_for(joining, final=True)
    finally:
        engine.close()
    first = next(i for i, e in enumerate(log) if e[0] == "sink" and any(r is joining for r, _ in e[1]))
    # Just before the hand-out: the decode of the joining request's first chunk (from frame 0) ...
    assert log[first - 1][0] == "decode" and log[first - 1][1:] == (32, [0]), log[:first]
    # ... and right after it, in the same step, the running request's next (longer) chunk.
    assert log[first + 1][0] == "decode" and log[first + 1][1] == 128 and 0 not in log[first + 1][2], log[first:]
    assert [r for r, _ in log[first][1]] == [joining]  # that hand-out carried the first chunk alone


async def _start_hub(engine, *overrides: str):
    from pipeline.engines import Engines
    from pipeline.hub import Hub
    from base.config import load_config

    cfg = load_config(None, ["server.port=0", "trace.path=none", "server.stages=tts", *overrides], environ={})
    hub = Hub(cfg, Engines.from_parts(cfg, None, None, [engine]))
    await hub.start()
    return hub


async def _speak(ws, request_id: str, rate: int) -> tuple[dict, list[np.ndarray]]:
    """One ``x.tts.speak`` on a JSON session; its ``x.tts.done`` and audio deltas."""
    await ws.send(json.dumps({"type": "x.tts.speak", "request_id": request_id, "text": SENTENCES,
                              "noise_scale": 0, "noise_w": 0}))
    deltas = []
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), scaled(120)))
        assert m["type"] != "error", m
        if m["type"] == "x.tts.audio.delta" and m["request_id"] == request_id:
            deltas.append(np.frombuffer(base64.b64decode(m["delta"]), "<i2"))
        elif m["type"] == "x.tts.done" and m["request_id"] == request_id:
            return m, deltas


async def test_batched_engine_serves_sessions_with_one_handoff_per_gpu_launch(batching_engine):
    hub = await _start_hub(batching_engine, "server.audio_delta_ms=200")
    try:
        speech = hub.engines.speech
        assert type(speech).__name__ == "BatchedSpeech"
        assert hub.engines.tts.name == "tts-text" and len(hub.engines.tts.engines) == 1  # no thread per request
        launches0 = sum(batching_engine.scheduler.lane_launches.values())
        seen: list[list] = [[] for _ in range(3)]
        conns = [await websockets.connect(url(hub), extensions=[_RecordingFactory(s)], compression=None)
                 for s in seen]
        try:
            for ws in conns:
                assert json.loads(await ws.recv())["type"] == "session.created"
            results = await asyncio.gather(*(_speak(ws, f"r{i}", 24000) for i, ws in enumerate(conns)))
        finally:
            for ws in conns:
                await ws.close()
        for done, deltas in results:
            assert done["status"] == "completed"
            total = sum(len(d) for d in deltas)
            assert total > 24000 and done["audio_ms"] == round(1000 * total / 24000)
            assert max(len(d) for d in deltas) == 24000 * 200 // 1000  # server.audio_delta_ms at 24 kHz
        # Deterministic settings: the three sessions got the same audio (up to the rounding of
        # different batch shapes, a few LSB of int16).
        first = np.concatenate(results[0][1]).astype(np.int32)
        for _, deltas in results[1:]:
            other = np.concatenate(deltas).astype(np.int32)
            assert len(other) == len(first) and np.abs(other - first).max() <= 8
        # At most one loop wake-up per finished GPU launch (a fast-lane launch's first chunks,
        # a main-lane launch's later ones), carrying the chunks of several requests.
        launches = sum(batching_engine.scheduler.lane_launches.values()) - launches0
        assert 0 < speech.handoffs <= launches
        assert speech.outcomes > speech.handoffs
        # permessage-deflate was negotiated, audio arrived uncompressed, other events compressed.
        for s in seen:
            assert s, "permessage-deflate was not negotiated"
        text_frames = [rsv1 for s in seen for op, rsv1 in s if op == 1]
        assert any(text_frames), "no text event was compressed"
        status, metrics, _ = await asyncio.to_thread(http_get, hub, "/metrics")
        assert status == 200
        for name in ("voxloop_event_loop_lag_seconds_count", "voxloop_outbox_depth_messages_gcount",
                     'voxloop_stage_queue_depth{stage="tts_gpu"}', 'voxloop_messages_sent_total{kind="audio"}',
                     'voxloop_bytes_sent_total{kind="event"}',
                     'voxloop_gc_pause_seconds_count{generation="0",process="server"}'):
            assert name in metrics, name
        sent_audio = float(re.search(r'voxloop_messages_sent_total\{kind="audio"\} (\S+)', metrics).group(1))
        assert sent_audio == sum(len(d) for _, d in results)
        # Where the first audio went, by part: one observation per request, parts adding up to
        # x.tts.done's first_audio_ms (to its 0.1 ms rounding, summed over the three requests).
        parts = {}
        for part in ("text", "engine", "from_engine", "out"):
            count = re.search(rf'voxloop_tts_first_audio_part_seconds_count\{{part="{part}"\}} (\S+)', metrics)
            total = re.search(rf'voxloop_tts_first_audio_part_seconds_sum\{{part="{part}"\}} (\S+)', metrics)
            assert count and float(count.group(1)) == 3, part
            parts[part] = 1000 * float(total.group(1))
        # The time to the last audio by part: one observation per request, the same way in (text),
        # the engine's part and the whole later than the first audio's.
        last = {}
        for part in ("text", "engine", "from_engine", "out"):
            count = re.search(rf'voxloop_tts_last_audio_part_seconds_count\{{part="{part}"\}} (\S+)', metrics)
            total = re.search(rf'voxloop_tts_last_audio_part_seconds_sum\{{part="{part}"\}} (\S+)', metrics)
            assert count and float(count.group(1)) == 3, part
            last[part] = 1000 * float(total.group(1))
        assert last["text"] == pytest.approx(parts["text"])
        assert last["engine"] >= parts["engine"] and sum(last.values()) > sum(parts.values())
        assert "to_engine" not in metrics  # one process: no link to the engine
        assert parts["engine"] > 0
        assert sum(parts.values()) == pytest.approx(sum(done["first_audio_ms"] for done, _ in results), abs=0.5)
    finally:
        await hub.stop(grace_s=1)


async def test_audio_frames_are_never_deflated_on_a_compressed_connection(batching_engine):
    """JSON audio deltas and binary audio frames keep RSV1 clear; every text event still parses."""
    hub = await _start_hub(batching_engine)
    try:
        seen: list = []
        async with websockets.connect(url(hub), extensions=[_RecordingFactory(seen)], compression=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            audio_rsv1, texts = [], []
            n = len(seen)
            _, deltas = await _speak(ws, "json", 24000)
            # Every message after session.created, in order: (opcode, rsv1).
            flags = seen[n:]
            assert len(flags) == len(deltas) + 1  # the deltas and x.tts.done
            audio_rsv1 = [rsv1 for _, rsv1 in flags[:-1]]
            assert not any(audio_rsv1)
            assert flags[-1] == (1, True)  # x.tts.done: text, compressed
            await ws.send(json.dumps({"type": "session.update", "session": {"x_binary_audio": True}}))
            texts.append(json.loads(await ws.recv()))
            assert texts[-1]["type"] == "session.updated"
            n = len(seen)
            await ws.send(json.dumps({"type": "x.tts.speak", "request_id": "bin", "text": "Hello there."}))
            binary = 0
            while True:
                m = await asyncio.wait_for(ws.recv(), scaled(60))
                if isinstance(m, bytes):
                    binary += 1
                    continue
                if json.loads(m)["type"] == "x.tts.done":
                    break
            assert binary > 0
            assert [f for f in seen[n:] if f[0] == 2] == [(2, False)] * binary
    finally:
        await hub.stop(grace_s=1)


async def test_audio_of_a_cancelled_stream_still_in_the_outbox_is_not_sent():
    """The writer skips queued audio deltas of a response / x.tts request cancelled since they were
    queued (a slow socket had held them back); other events still go out, in order."""
    from types import SimpleNamespace

    from pipeline.hub import Hub
    from pipeline.session import Session
    from realtime.protocol import RealtimeProtocol

    class SlowSocket:
        def __init__(self) -> None:
            self.frames: list = []
            self.open = asyncio.Event()

        async def send(self, frame) -> None:
            await self.open.wait()
            self.frames.append(json.loads(frame))

    session = Session.__new__(Session)  # only its audio bookkeeping is used here
    session._stopped_audio = collections.OrderedDict()
    pcm = np.zeros(2400, np.int16)
    outbox: asyncio.Queue = asyncio.Queue()
    for i in range(3):
        outbox.put_nowait(ev.XTtsAudioDelta(request_id="tts_1", pcm=pcm))
        outbox.put_nowait(ev.XTtsAudioDelta(request_id="tts_2", pcm=pcm))
    outbox.put_nowait(ev.XTtsDone(request_id="tts_1", status="cancelled"))
    ws, sent = SlowSocket(), []
    hub = SimpleNamespace(sent=SimpleNamespace(count=lambda frame, binary: None))
    writer = asyncio.create_task(Hub._write(hub, ws, RealtimeProtocol(), outbox, sent.append, session.sendable))
    await asyncio.sleep(0.05)  # the first delta is stuck in the socket
    session._stop_audio("tts_1")  # x.tts.cancel arrives
    ws.open.set()
    await asyncio.wait_for(_drained(outbox), scaled(5))
    writer.cancel()
    kinds = [(f["type"], f.get("request_id")) for f in ws.frames]
    assert kinds == [("x.tts.audio.delta", "tts_1")] + [("x.tts.audio.delta", "tts_2")] * 3 + [("x.tts.done", "tts_1")]
    assert len(sent) == len(ws.frames)


async def _drained(outbox: asyncio.Queue) -> None:
    while not outbox.empty():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


async def test_short_text_is_phonemized_on_the_loop_when_the_text_thread_is_idle():
    """``tts.inline_text_chars``: a short text skips the text thread's two hand-offs while that
    thread is idle; a longer one, or any while the thread is busy, goes through the thread."""
    import threading

    from pipeline.speech import sentence_ids
    from pipeline.workers import NORMAL, ModelWorker

    class Text:
        def __init__(self) -> None:
            self.threads: list[str] = []
            self.hold = threading.Event()

        def sentence_ids(self, text: str) -> list[list[int]]:
            self.threads.append(threading.current_thread().name)
            if text == "hold":
                assert self.hold.wait(scaled(5))
            return [[len(text)]]

    text = Text()
    worker = ModelWorker("tts-text", [text])
    cancel = threading.Event()
    loop_thread = threading.current_thread().name
    try:
        assert await sentence_ids(worker, "Hello there.", NORMAL, cancel, 20) == [[12]]
        assert text.threads == [loop_thread]
        assert await sentence_ids(worker, "x" * 21, NORMAL, cancel, 20) == [[21]]  # too long
        assert await sentence_ids(worker, "Hello there.", NORMAL, cancel, 0) == [[12]]  # turned off
        assert text.threads[1:] == ["tts-text-0", "tts-text-0"]
        held = asyncio.ensure_future(sentence_ids(worker, "hold", NORMAL, cancel, 0))
        while len(text.threads) < 4:  # the thread is busy with it
            await asyncio.sleep(0.001)
        short = asyncio.ensure_future(sentence_ids(worker, "Hi.", NORMAL, cancel, 20))
        await asyncio.sleep(0.01)
        assert not short.done()  # queued behind the busy thread, not run on the loop
        text.hold.set()
        assert await held == [[4]] and await short == [[3]]
        assert text.threads[3:] == ["tts-text-0", "tts-text-0"]
    finally:
        text.hold.set()
        worker.close()
