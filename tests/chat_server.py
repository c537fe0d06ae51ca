"""A real OpenAI-compatible chat server for tests: llama-cpp-python's own (``python -m llama_cpp.server``),
serving the bundled SmolLM2 GGUF on a free port of 127.0.0.1.

It renders prompts with the GGUF's own chat template (its default chat format), which shows the
model tool outputs (``role: "tool"``) and, for a named ``tool_choice``, constrains the call's
arguments with a grammar built from the tool's JSON schema. Its ``chatml-function-calling``
format was tried and left: its template drops tool outputs from the prompt, and ``auto`` fails
while streaming once the model picks a function ("Automatic streaming tool choice is not supported").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from conftest import scaled
from rt import free_port, http_get

#: The name the server gives its one model (``/v1/models``); voxloop picks it when ``llm.model`` is unset.
MODEL_ALIAS = "smollm2-135m-instruct"


def start_chat_server(port: int | None = None, api_key: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server (on ``port``, or a free one; asking for ``api_key`` when given) and wait until it has answered one reply:
    the first after start pages the model in (4 s on 2 cores), which no test should time.
    Returns the process and its API root (``http://127.0.0.1:PORT/v1``)."""
    from base.config import load_config
    from base.models import resolve_llm

    port = port or free_port()
    gguf = resolve_llm(load_config(None, [], environ={})).path
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_ALIAS,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1", "--verbose", "false",
         # One reply at a time; by default a new request makes it drop the running reply.
         "--interrupt_requests", "false", *(["--api_key", api_key] if api_key else [])],
        stdout=subprocess.DEVNULL, stderr=log, text=True)
    deadline = time.monotonic() + scaled(120)
    while http_get(port, "/v1/models")[0] not in (200, 401):
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"llama_cpp.server exited: {log.read()[-3000:]}")
        assert time.monotonic() < deadline, "llama_cpp.server never answered"
        time.sleep(0.2)
    base_url = f"http://127.0.0.1:{port}/v1"
    import openai

    openai.OpenAI(base_url=base_url, api_key=api_key or "none").chat.completions.create(
        model=MODEL_ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    return proc, base_url


def stop_chat_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)  # a test may have paused it
        proc.kill()
        proc.wait()
