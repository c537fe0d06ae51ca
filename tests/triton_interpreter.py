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
from base import models
from base.config import load_config

model = load_vits(models.resolve_voice(load_config(None, [], environ={})).path)
"""

#: ``VOICE_MODEL`` with the text encoder's convolutions as cuBLAS products (``encoder_convs = "gemm"``,
#: the engine's) and ``fused``, a copy of that model for the kernel under test to change.
GEMM_VOICE_PAIR = VOICE_MODEL + r"""
from tts_engine.torch_vits.kernels.gemm_conv import use_gemm_convs

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


def hopper_usage(fn, signature: dict, constants: dict, aligned: list[str], warps: int, **options: object) -> tuple[int, int]:
    """``fn`` (a ``triton.jit`` kernel) compiled for sm_90 without a GPU (Triton's own ptxas) with
    ``signature`` (argument -> type; the constants' names are added as constexpr), ``constants``, the
    arguments in ``aligned`` known to be multiples of 16 (as a launch specializes them) and ``warps``:
    its registers a thread and spill stack in bytes, read by Triton's bundled cuobjdump (the test is
    skipped where this Triton install has none)."""
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.access(cuobjdump, os.X_OK):
        pytest.skip("this Triton install has no cuobjdump")
    names = list(fn.arg_names)
    full = {a: signature.get(a, "constexpr") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    kernel = triton.compile(ASTSource(fn=fn, signature=full, constexprs=constants, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, **options})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        out = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return int(m.group(1)), int(m.group(2))
