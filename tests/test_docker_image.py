"""The CPU image, built and run for real (``make docker-test``; opt-in: VOXLOOP_DOCKER_TEST=1).

Builds docker/Dockerfile on a Debian base made here (tests/docker_harness.py), runs it
with host networking, waits for the HEALTHCHECK, speaks (``x.tts.speak``), has one
spoken push-to-talk turn through the container's WebSocket, then ``docker stop``s it
with a turn in flight: the turn finishes, the session closes 1001, exit code 0 within
the grace period. Containers, images and any daemon the test started are removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import scaled
from rt import free_port, http_get

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(1800),  # a cold first run debootstraps and may compile llama-cpp-python
    pytest.mark.skipif(os.environ.get("VOXLOOP_DOCKER_TEST") != "1",
                       reason="image test is opt-in: `make docker-test` (VOXLOOP_DOCKER_TEST=1)"),
]

GRACE_S = 15.0  # server.shutdown_grace_s inside the container
log = logging.getLogger(__name__)


def _words(text: str) -> set[str]:
    return set(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="module")
def harness():
    import docker_harness as dh

    h = dh.DockerHarness()
    try:
        try:
            how = h.ensure_daemon()
            dh.base_rootfs_tarball()
        except dh.EngineUnavailable as exc:
            pytest.skip(f"no Docker engine here: {exc}")
        log.info("docker daemon: %s", how)
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def build_inputs(harness):
    """(base image ref, wheelhouse dir) shared by the builds."""
    import docker_harness as dh

    return harness.import_base(dh.base_rootfs_tarball()), dh.wheelhouse()


@pytest.fixture(scope="module")
def image(harness, build_inputs):
    base, wheels = build_inputs
    ref, build_s = harness.build_image(base, wheels)
    sizes = {"base_mb": harness.image_size(base) / 1e6, "cpu_image_mb": harness.image_size(ref) / 1e6}
    print(f"\nimage {ref}: built in {build_s:.0f} s; sizes {json.dumps(sizes)}")
    return ref


def _start_ready(harness, image: str, mounts: tuple[str, ...] = ()) -> tuple[str, int]:
    """Run ``image`` on a free host port; wait for HEALTHCHECK healthy and /ready 200."""
    port = free_port()
    name = harness.run(image, env={"VOXLOOP_SERVER__PORT": str(port),
                                   "VOXLOOP_SERVER__SHUTDOWN_GRACE_S": str(GRACE_S)}, mounts=mounts)
    healthy_s = harness.wait_healthy(name, timeout_s=scaled(90))
    deadline = time.monotonic() + scaled(120)
    while http_get(port, "/ready")[0] != 200:
        assert time.monotonic() < deadline, f"/ready never 200:\n{harness.logs(name)}"
        assert harness.state(name)["Running"], harness.logs(name)
        time.sleep(0.5)
    print(f"\ncontainer {name}: healthy after {healthy_s:.1f} s, ready on :{port}")
    return name, port


@pytest.fixture(scope="module")
def container(harness, image):
    return _start_ready(harness, image)


def test_image_metadata(harness, image):
    cfg = json.loads(harness.docker("image", "inspect", "-f", "{{json .Config}}", image).stdout)
    assert cfg["User"] == "voxloop"
    assert cfg["StopSignal"] == "SIGINT"
    assert "8765/tcp" in cfg["ExposedPorts"]
    assert "/health" in " ".join(cfg["Healthcheck"]["Test"])
    out = harness.docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                         "id -u; ls /models/asr /models/llm /models/tts; "
                         "test ! -e /usr/bin/gcc && test ! -d /wheelhouse && "
                         "! /opt/venv/bin/python -c 'import torch' 2>/dev/null && echo slim").stdout.split()
    assert out[0] != "0", "runs as root"
    assert {"model.bin", "SmolLM2-135M-Instruct.Q4_1.gguf", "en_US-joe-medium.onnx"} <= set(out)
    assert out[-1] == "slim", "build tools, the wheelhouse or PyTorch leaked into the runtime stage"


async def test_speak_and_spoken_turn(container, cfg):
    from bench.piper_speech import PiperSpeech, silence
    from voxloop.client import RealtimeClient

    name, port = container
    assert http_get(port, "/health")[:2] == (200, "ok\n")
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    async with RealtimeClient.connect(url, session={"audio": {"input": {"turn_detection": None}}}) as c:
        tts = await c.speak("Hello from inside the container.", timeout_s=scaled(30))
        assert tts.status == "completed" and tts.sample_rate == c.session.output_rate
        assert len(tts.pcm) / tts.sample_rate > 0.8 and np.abs(tts.pcm).max() > 1000

        question = "What is the capital of France?"
        speech = np.concatenate([silence(200), PiperSpeech(cfg).say(question), silence(300)])
        await c.send_audio(speech, sample_rate=16000)
        await c.commit()
        reply = await c.collect_response(timeout_s=scaled(60))
    assert reply.status == "completed", reply
    assert {"capital", "france"} <= _words(reply.user_transcript or ""), reply.user_transcript
    assert len(_words(reply.transcript)) >= 2, reply.transcript
    assert reply.audio_s > 0.5
    status, metrics, _ = http_get(port, "/metrics")
    assert status == 200 and re.search(r"^voxloop_sessions_active 0\.0$", metrics, re.M), metrics


async def test_docker_stop_drains_turn_and_exits_0(harness, container):
    from voxloop.client import RealtimeClient
    from base.errors import ConnectionFailed

    name, port = container
    # A short reply (40 tokens) so the turn fits the grace period on a loaded 2-core machine.
    c = await RealtimeClient.connect(f"ws://127.0.0.1:{port}/v1/realtime", session={"max_output_tokens": 40})
    await c.send_text("Tell me a short story about a lighthouse keeper.")
    await c.wait_for("response.created", timeout_s=scaled(30))
    t0 = time.monotonic()
    stop = asyncio.create_task(asyncio.to_thread(
        harness.docker, "stop", "-t", str(int(GRACE_S + 20)), name, timeout=GRACE_S + 60))
    reply = await c.collect_response(timeout_s=GRACE_S + 5, metrics_timeout_s=0, raise_on_error=False)
    with pytest.raises(ConnectionFailed) as closed:
        await c.wait_for("response.created", timeout_s=GRACE_S + 5)
    await stop
    stopped_s = time.monotonic() - t0
    await c.close()
    state = harness.state(name)
    # Finished, not cancelled: "completed", or "incomplete" at the 40-token limit (max_output_tokens).
    assert reply.status == "completed" or (reply.status, reply.reason) == ("incomplete", "max_output_tokens"), \
        f"the turn in flight was not allowed to finish: {reply.status} ({reply.reason})"
    assert closed.value.close_code == 1001, closed.value
    assert state["Status"] == "exited" and state["ExitCode"] == 0, (state, harness.logs(name))
    assert stopped_s < GRACE_S + 5, f"stop took {stopped_s:.1f} s (grace {GRACE_S} s)"
    assert "draining" in harness.logs(name)


async def test_models_mounted_instead_of_baked(harness, build_inputs, image):
    """BAKE_MODELS=0: no models in the image; the same layout mounted read-only at /models."""
    from voxloop.client import RealtimeClient

    base, wheels = build_inputs
    ref, _ = harness.build_image(base, wheels, bake_models=False)
    sizes = harness.image_size(ref), harness.image_size(image)
    print(f"\nimage {ref}: {sizes[0] / 1e6:.0f} MB (with models {sizes[1] / 1e6:.0f} MB)")
    assert sizes[1] - sizes[0] > 250e6, sizes
    listing = harness.docker("run", "--rm", "--entrypoint", "ls", ref, "-A", "/models").stdout
    assert listing.strip() == "", listing
    models = Path(tempfile.mkdtemp(prefix="voxloop-models-", dir="/var/tmp"))
    try:
        models.chmod(0o755)  # readable by the image's uid 10001
        root = Path(__file__).resolve().parent.parent
        subprocess.run([sys.executable, str(root / "docker" / "stage_models.py"), str(models)],
                       check=True, capture_output=True, timeout=300)
        name, port = _start_ready(harness, ref, mounts=(f"{models}:/models:ro",))
        async with RealtimeClient.connect(f"ws://127.0.0.1:{port}/v1/realtime") as c:
            tts = await c.speak("Models from a volume.", timeout_s=scaled(30))
        assert tts.status == "completed" and len(tts.pcm) > 0
        harness.docker("stop", "-t", str(int(GRACE_S + 20)), name, timeout=GRACE_S + 60)
        assert harness.state(name)["ExitCode"] == 0, harness.logs(name)
    finally:
        shutil.rmtree(models, ignore_errors=True)
