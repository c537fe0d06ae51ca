"""Raw-WebSocket helpers for server tests (no client library: the wire format itself)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import urllib.error
import urllib.request

import numpy as np

from conftest import scaled


def url(hub, path: str = "/v1/realtime", x_events: bool = True) -> str:
    """The WebSocket URL of ``hub``; ``x_events``: ask for the ``x.*`` events (these tests read them)."""
    return f"ws://127.0.0.1:{hub.port}{path}" + (("&" if "?" in path else "?") + "x_events=true" if x_events else "")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers started in another process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(target, path: str, headers: dict | None = None) -> tuple[int, str, dict]:  # noqa: ANN001
    """GET ``path`` from a ``Hub`` or a port on 127.0.0.1: (status, body, headers); status 0 when
    nothing answers (a server still starting)."""
    port = target if isinstance(target, int) else target.port
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)
    except OSError as e:
        return 0, str(e), {}


async def recv(ws, timeout=10.0) -> dict:
    msg = await asyncio.wait_for(ws.recv(), scaled(timeout))
    return json.loads(msg)


async def until(ws, type_: str, timeout=20.0) -> tuple[dict, list[dict]]:
    seen = []
    deadline = time.monotonic() + scaled(timeout)
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic())))
        seen.append(m)
        if m["type"] == type_:
            return m, seen


def append(pcm: np.ndarray) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode()})


def user_text(text: str) -> list[str]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [json.dumps({"type": "conversation.item.create", "item": item}), json.dumps({"type": "response.create"})]


def speech_24k(seconds: float) -> np.ndarray:
    """A loud voiced-like signal webrtcvad calls speech: harmonic buzz with a syllable envelope."""
    t = np.arange(int(24000 * seconds)) / 24000
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000
    sig = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t) ** 2
    return (sig * env * 6000).astype(np.int16)
