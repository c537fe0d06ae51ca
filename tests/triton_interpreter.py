"""Fused-kernel tests on machines without CUDA: a script run under Triton's interpreter.

``TRITON_INTERPRET=1`` is read when Triton compiles a kernel, hence a fresh process per script
(``CUDA_VISIBLE_DEVICES`` emptied, the repository on ``PYTHONPATH``). The script prints one JSON
object on its last line; ``interpret`` returns it. ``needs_triton``: skip where Triton is not
installed (PyTorch's CPU builds do not bring it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


#: A script's opening: the bundled voice's model (``model``), the load bench's sentences
#: (``load_sentences``) and ``pad_ids``.
VOICE_MODEL = r"""
import copy, json
import torch
from bench.harness import load_sentences
from tts_engine.torch_vits.model import pad_ids
from tts_engine.torch_vits.weights import load_vits
from voxloop import models
from voxloop.config import load_config

model = load_vits(models.resolve_voice(load_config(None, [], environ={})).path)
"""

#: ``VOICE_MODEL`` with the text encoder's convolutions as cuBLAS products (``encoder_convs = "gemm"``,
#: the engine's) and ``fused``, a copy of that model for the kernel under test to change.
GEMM_VOICE_PAIR = VOICE_MODEL + r"""
from tts_engine.torch_vits.gemm_conv import use_gemm_convs

use_gemm_convs(model.enc_p)
fused = copy.deepcopy(model)
"""


def interpret(script: str, *args: str, timeout: float = 900) -> dict:
    """Run ``python -c script args`` in Triton's interpreter; its last stdout line as JSON."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
