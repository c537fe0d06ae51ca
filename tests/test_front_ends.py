"""``server.front_ends = 2``: two WebSocket front-end processes on one port and one engine process.

The engine is the batching GPU engine run on the CPU (``tts.device = "cpu"``, no CUDA graphs), so
the whole process model runs as on a GPU host: front ends phonemize, resample and serialize; the
engine process batches every front end's requests and returns each step in one message. With
``server.engine_stages = asr,llm`` (the default when those run on the GPU) the engine process also
transcribes and answers for both front ends, as on a GPU host.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import websockets

from conftest import scaled
from rt import free_port, http_get

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600)),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT front ends need Linux")]
ROOT = Path(__file__).resolve().parent.parent


def start(*settings: str):  # noqa: ANN201 - (Popen, port)
    port = free_port()
    cmd = [sys.executable, "-m", "voxloop", "--set", "server.front_ends=2",
           "--set", "tts.backend=cuda", "--set", "tts.device=cpu", "--set", "tts.cuda_graphs=false",
           "--set", "tts.max_batch=8", "--set", "limits.max_sessions=5", "--set", "trace.path=none",
           "--set", "server.shutdown_grace_s=5", "--set", "server.gc_freeze=true"]
    for setting in settings:
        cmd += ["--set", setting]
    cmd += ["serve", "--port", str(port)]
    log = open(os.devnull, "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + scaled(240)
    while http_get(port, "/ready")[0] != 200:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.5)
    return proc, port


def stop(proc) -> None:  # noqa: ANN001
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture()
def server():
    # The engine hands out 24 kHz (resampled in its decoder steps), the sessions' rate: no front-end resampling.
    proc, port = start("server.stages=tts", "tts.output_rate=24000")
    yield proc, port
    stop(proc)


@pytest.fixture()
def voice_server():
    proc, port = start("server.engine_stages=asr,llm", "llm.temperature=0", "llm.max_tokens=24")
    yield proc, port
    stop(proc)


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


async def one_session_per_front_end(proc, port: int) -> list:  # noqa: ANN001
    """A session on each of the two front ends (the kernel picks the front end per connection:
    extra connections to a front end already covered are closed; 40 tries leave odds of 2**-39)."""
    # The front ends are the spawned children listening on the port (multiprocessing also starts its
    # resource tracker; with the LLM in engine_stages, the LLM process is spawned too).
    fronts = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())
              and any(conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
                      for conn in c.net_connections("tcp"))]
    assert len(fronts) == 2
    conns, served_by = [], set()
    for _ in range(40):
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime")  # offers permessage-deflate
        assert json.loads(await ws.recv())["type"] == "session.created"
        front = _front_end_of(fronts, ws.local_address[1])
        if front in served_by:
            await ws.close()
            continue
        conns.append(ws)
        served_by.add(front)
        if len(served_by) == 2:
            return conns
    raise AssertionError(f"connections reached front ends {served_by} only")


async def test_two_front_ends_share_one_engine_limits_metrics_and_drain(server):
    proc, port = server
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    conns = await one_session_per_front_end(proc, port)
    try:
        samples = await asyncio.gather(*(_speak(ws, f"r{i}") for i, ws in enumerate(conns)))
        assert all(s > 24000 for s in samples)
        # One counter for both processes: fill the 5 slots, the next upgrade is refused.
        while len(conns) < 5:
            conns.append(await websockets.connect(url))
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url)
        assert refused.value.response.status_code == 503
        status, metrics, _ = await asyncio.to_thread(http_get, port, "/metrics")
        assert status == 200
        assert re.search(r"^voxloop_sessions_active 5\.0$", metrics, re.M), "sessions not summed over front ends"
        audio = float(re.search(r'^voxloop_messages_sent_total\{kind="audio"\} (\S+)$', metrics, re.M).group(1))
        assert audio >= len(samples)  # every front end's deltas, whichever front end was scraped
        assert 'voxloop_stage_queue_depth{stage="tts_gpu"}' in metrics  # the engine process's scheduler
        # Garbage-collection pauses of the scraped front end and of the engine process (its report,
        # once a second), each with at least the full collection before its gc.freeze() after loading.
        patterns = [rf'^voxloop_gc_pause_seconds_count\{{generation="2",process="{p}"\}} [1-9]'
                    for p in ("front_end", "engine")]
        deadline = time.monotonic() + scaled(10)
        while not all(re.search(p, metrics, re.M) for p in patterns) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            metrics = (await asyncio.to_thread(http_get, port, "/metrics"))[1]
        for pattern in patterns:
            assert re.search(pattern, metrics, re.M), pattern
        for which in ("first", "last"):  # both speaks' first and last audio, by part
            for part in ("text", "to_engine", "engine", "from_engine", "out"):
                count = re.search(rf'^voxloop_tts_{which}_audio_part_seconds_count\{{part="{part}"\}} (\S+)$', metrics, re.M)
                assert count and float(count.group(1)) == len(samples), (which, part)
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


async def _ask(ws, pcm_24k) -> tuple[str, str, int]:  # noqa: ANN001
    """Push-to-talk a question; (transcript, reply text, reply audio samples) once the response is done."""
    for i in range(0, len(pcm_24k), 2400):
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm_24k[i:i + 2400].tobytes()).decode()}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "response.create"}))
    transcript, reply, samples = None, "", 0
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), scaled(120)))
        assert m["type"] != "error", m
        if m["type"] == "conversation.item.input_audio_transcription.completed":
            transcript = m["transcript"]
        elif m["type"] == "response.output_audio_transcript.delta":
            reply += m["delta"]
        elif m["type"] == "response.output_audio.delta":
            samples += len(base64.b64decode(m["delta"])) // 2
        elif m["type"] == "response.done":
            assert m["response"]["status"] in ("completed", "incomplete"), m
            return transcript, reply, samples


async def test_the_engine_process_transcribes_and_answers_for_both_front_ends(voice_server, cfg):
    import soxr

    from bench.piper_speech import RATE, PiperSpeech

    proc, port = voice_server
    spawned = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(spawned) == 3  # two front ends and the LLM process
    # numpy's BLAS on one thread in the spawned processes too (voxloop serve sets it before numpy
    # loads; /proc shows a process's environment as it started, so only the children's).
    assert all(p.environ().get("OPENBLAS_NUM_THREADS") == "1" for p in spawned)
    question = PiperSpeech(cfg).say("What is the capital of France?")
    pcm = soxr.resample(question, RATE, 24000).astype("int16")
    conns = await one_session_per_front_end(proc, port)
    try:
        for ws in conns:  # push-to-talk: turn detection off
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
        answers = await asyncio.gather(*(_ask(ws, pcm) for ws in conns))
        for transcript, reply, samples in answers:
            assert "what is the capital of" in transcript.lower()
            assert reply.strip() and samples > 0
        assert answers[0][0] == answers[1][0]
        # Temperature 0, the same question: the same reply from the one batched LLM, whichever front end asked.
        assert answers[0][1] == answers[1][1]
        await asyncio.sleep(1.5)  # the engine process reports once a second
        status, metrics, _ = await asyncio.to_thread(http_get, port, "/metrics")
        assert status == 200
        # Both front ends' conversations hold sequences of the engine process's one LLM context.
        assert re.search(r'^voxloop_llm_sequences\{state="held"\} 2\.0$', metrics, re.M), metrics
        utterances = re.search(r"^voxloop_asr_utterances_total (\S+)$", metrics, re.M)
        assert utterances and float(utterances.group(1)) >= 2  # warm-up not counted: both questions
        await _call_round_trip(conns[0])  # function calls cross from the LLM process too
    finally:
        for ws in conns:
            await ws.close()
        stop(proc)


async def test_each_front_end_streams_replies_from_an_llm_server_itself():
    """``llm.backend = "openai"``: no LLM process; each front end asks the server (llama-cpp-python's,
    tests/chat_server.py) for its own sessions' replies, and temperature 0 gives both the same one."""
    from chat_server import start_chat_server, stop_chat_server

    llm, base_url = await asyncio.to_thread(start_chat_server)
    proc = None
    try:
        proc, port = await asyncio.to_thread(start, "server.stages=llm,tts", "llm.backend=openai",
                                             f"llm.base_url={base_url}", "llm.temperature=0", "llm.max_tokens=24")
        spawned = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(spawned) == 2  # the two front ends, no LLM process
        conns = await one_session_per_front_end(proc, port)
        replies = []
        try:
            for ws in conns:
                item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}
                await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
                await ws.send(json.dumps({"type": "response.create"}))
                while (m := json.loads(await asyncio.wait_for(ws.recv(), scaled(120))))["type"] != "response.done":
                    assert m["type"] != "error", m
                assert m["response"]["status"] in ("completed", "incomplete"), m
                replies.append(m["response"]["output"][0]["content"][0]["transcript"])
        finally:
            for ws in conns:
                await ws.close()
        assert replies[0].strip() and replies[0] == replies[1]
    finally:
        if proc is not None:
            stop(proc)
        stop_chat_server(llm)


async def test_the_llm_process_scores_the_words_of_a_front_ends_turn(voice_server, cfg):
    """semantic_vad in a front end with the LLM in its own process: the words' end-of-turn score is
    asked over the link with the speculative reply's request and read there from the reply's prompt
    (no probe of its own: ``/metrics``, the LLM process's report)."""
    import numpy as np
    import soxr

    from bench.piper_speech import RATE, PiperSpeech

    proc, port = voice_server
    question = PiperSpeech(cfg).say("What is the capital of France?")
    pcm = np.concatenate((soxr.resample(question, RATE, 24000), np.zeros(24000 * 3))).astype("int16")
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "x_events": True, "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}))
        for i in range(0, len(pcm), 480):  # real time, 20 ms frames
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + 480].tobytes()).decode()}))
            await asyncio.sleep(0.02)
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), scaled(120)))
            assert m["type"] != "error", m
            if m["type"] == "x.turn.metrics":
                break
    assert m["metrics"]["words_end_of_turn"] >= cfg.turn.words_threshold, m["metrics"]
    probes: dict[str, float] = {}
    deadline = time.monotonic() + scaled(10)  # the LLM process reports once a second
    while not probes.get("shared") and time.monotonic() < deadline:
        body = http_get(port, "/metrics")[1]
        probes = {k: float(v) for k, v in re.findall(r'voxloop_llm_end_of_turn_probes_total\{read="(\w+)"\} (\S+)', body)}
        await asyncio.sleep(0.5)
    assert probes.get("shared", 0) >= 1 and probes.get("alone", 0) == 0, probes


async def _call_round_trip(ws) -> None:  # noqa: ANN001
    """A required call through the LLM process (its ``ToolCallDelta`` s ride the engine link), its
    output back, and the answer."""
    tool = {"type": "function", "name": "now", "description": "The time", "parameters": {"type": "object"}}
    # a short call: this server's replies stop at 24 tokens
    await ws.send(json.dumps({"type": "session.update", "session": {"tools": [tool], "output_modalities": ["text"]}}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "required"}}))
    while (m := json.loads(await asyncio.wait_for(ws.recv(), scaled(120))))["type"] != "response.done":
        assert m["type"] != "error", m
    [call] = m["response"]["output"]
    assert call["type"] == "function_call" and call["name"] == "now" and json.loads(call["arguments"]) == {}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": output}))
    await ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "none"}}))
    while (m := json.loads(await asyncio.wait_for(ws.recv(), scaled(120))))["type"] != "response.done":
        assert m["type"] != "error", m
    assert m["response"]["status"] in ("completed", "incomplete") and m["response"]["output"][0]["type"] == "message"


def test_serve_sets_blas_threads_before_numpy_loads():
    """``voxloop serve`` caps numpy's OpenBLAS at one thread (bench/blas_threads.py); an
    environment variable only counts if numpy has not loaded yet when the command starts."""
    code = ("import sys, voxloop.cli, voxloop.commands.serve; print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_llm_process_loads_no_onnxruntime_or_torch():
    """The LLM process imports what it serves with only: a CUDA build of llama.cpp crashed when
    onnxruntime or PyTorch loaded after it in one process (H200 host, CUDA 13)."""
    code = ("import sys, pipeline.front_ends, pipeline.engine_link, pipeline.engines, llm.batched; "
            "print(sorted(m for m in ('onnxruntime', 'torch', 'ctranslate2', 'faster_whisper') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_step_that_ends_while_a_speak_is_being_registered_loses_nothing(tmp_path):
    """The engine's sink may run (on the scheduler thread) before ``_on_speak`` has recorded the
    request's key: the outcome must still reach the front end, not be dropped."""
    import socket
    import threading

    import numpy as np

    from pipeline.engine_link import EngineHost, frame, read_message, send_parts
    from tts_engine.engine import AudioChunk

    class Request:
        def cancel(self) -> None:
            pass

    class QuickEngine:
        """A step finishes between ``submit_sentences`` and the key's registration."""

        def submit_sentences(self, sentences, options, sink):
            requests = [Request() for _ in sentences]
            chunk = AudioChunk(np.ones(4, np.int16), 22050, 0, True)
            step = threading.Thread(target=sink, args=([(requests[0], chunk)],))
            step.start()
            step.join(0.2)  # the scheduler thread's step, done (or blocked) before we return
            return requests, 22050

    host = EngineHost(QuickEngine(), str(tmp_path / "engine.sock"))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(host.path)
            conn.settimeout(scaled(5))
            send_parts(conn, frame(("speak", 7, [[1, 2, 3]], None)))
            reader = conn.makefile("rb")
            while (message := read_message(reader.read))[0] != "step":
                pass
        (key, clause, final, pcm, (received, handed_out)), = message[1]
        assert (key, clause, final, bytes(pcm)) == (7, 0, True, np.ones(4, np.int16).tobytes())
        assert received <= handed_out  # a speak's first chunk carries the engine's stamps
    finally:
        host.close()


def test_front_ends_exit_when_the_engine_process_is_killed(server):
    """SIGKILL of the engine process (no drain possible): its front ends and LLM process must not live
    on, listening on the shared port with no engine behind them, taking the next server's connections."""
    proc, port = server
    children = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    listening = [c for c in children if any(s.laddr.port == port and s.status == "LISTEN"
                                            for s in c.net_connections("tcp"))]
    assert len(listening) == 2
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=scaled(15))
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    with socket.socket() as s:  # nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_the_server_stops_when_its_llm_process_dies(voice_server):
    """Every reply needs the LLM process: once it is gone the server drains its front ends and exits
    with code 1 (for systemd or Docker to restart it) instead of accepting sessions it cannot answer."""
    proc, port = voice_server
    spawned = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    llm = [c for c in spawned if not any(s.laddr.port == port for s in c.net_connections("tcp"))]
    assert len(llm) == 1  # the two front ends listen on the port; the LLM process does not
    llm[0].kill()
    assert proc.wait(timeout=scaled(60)) == 1
    gone, alive = psutil.wait_procs(spawned, timeout=scaled(15))
    assert not alive


def test_engine_link_messages_carry_audio_out_of_band_aligned_and_whole():
    """A step's audio leaves the engine process as views of its own samples (no copy in the pickle),
    arrives int16-aligned and intact through partial socket writes, by the blocking and the asyncio
    reader alike; other messages (no buffers) still travel."""
    import pickle
    import threading

    import numpy as np

    from pipeline.engine_link import frame, read_message, read_message_async, send_parts

    rng = np.random.default_rng(3)
    block = rng.integers(-32768, 32767, 300_001, dtype=np.int16)
    chunks = [block[1:4], block[5:300_001], block[:0]]  # offsets and lengths off 8 bytes, an empty one
    message = ("step", [(k, 0, True, pickle.PickleBuffer(c), (None, 1.0)) for k, c in enumerate(chunks)]
               + [(9, ValueError("bad ids"))])
    parts = frame(message)
    assert any(isinstance(p, memoryview) and np.shares_memory(np.asarray(p), block) for p in parts)
    assert sum(len(p) for p in parts[1:]) % 8 == 0

    def check(got) -> None:
        assert got[0] == "step" and got[1][3][0] == 9 and str(got[1][3][1]) == "bad ids"
        for (key, _, _, pcm, _), want in zip(got[1][:3], chunks):
            samples = np.frombuffer(pcm, dtype=np.int16)
            assert samples.flags.aligned  # a view of the payload, at a multiple of 8 bytes in it
            np.testing.assert_array_equal(samples, want)

    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # sendmsg writes a part at a time
        writer = threading.Thread(target=lambda: [send_parts(a, frame(m)) for m in (message, ("report", {"x": 1}))])
        writer.start()
        reader = b.makefile("rb")
        check(read_message(reader.read))
        assert read_message(reader.read) == ("report", {"x": 1})
        writer.join()
        a.shutdown(socket.SHUT_WR)
        assert read_message(reader.read) is None  # end of stream

    async def over_asyncio() -> None:
        r = asyncio.StreamReader(limit=2**26)
        for p in frame(message):
            r.feed_data(bytes(p))
        r.feed_eof()
        check(await read_message_async(r))
        with pytest.raises(asyncio.IncompleteReadError):
            await read_message_async(r)

    asyncio.run(over_asyncio())
