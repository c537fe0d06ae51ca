#!/usr/bin/env bash
# GPU TTS checks + profile + load benchmark on a CUDA host (the lent H200 box: python3 with
# torch/onnx/onnxruntime, no PyPI). The voice (.onnx + .json) and a soxr wheel travel in
# .devcarry/ (git-ignored). Stages (comma list, run in this order): tests, load, load2 (a second
# configuration, e.g. LOAD2_ARGS="--compile"), profile, memory, oom, int8, ws, experiments; or all;
# "stash" only keeps the carried files in /tmp/voxcarry. Results in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_bench}
STAGES=${1:-all}
mkdir -p "$OUT"
# The voice (60 MiB) and the packages in .devcarry/site may travel in separate calls: each is
# kept in /tmp/voxcarry on the device while the machine stays warm.
mkdir -p /tmp/voxcarry
[ -f .devcarry/en_US-joe-medium.onnx ] && cp .devcarry/en_US-joe-medium.onnx* /tmp/voxcarry/
[ -d .devcarry/site ] && rm -rf /tmp/voxcarry/site && cp -r .devcarry/site /tmp/voxcarry/site
[ -d .devcarry/whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/voxcarry/site .devcarry/whl/*.whl
export PYTHONUNBUFFERED=1 VOXLOOP_TTS__VOICE_PATH=/tmp/voxcarry/en_US-joe-medium.onnx
export PYTHONPATH="/tmp/voxcarry/site:$PWD"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-backend:cudaMallocAsync}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, onnx, onnxruntime, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, onnx.__version__, onnxruntime.__version__)"
has() { [ "$STAGES" = all ] || [[ ",$STAGES," == *",$1,"* ]]; }
[ "$STAGES" = stash ] && { ls -la /tmp/voxcarry; exit 0; }
if has tests; then
  timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -x -q -s -p no:cacheprovider tests/test_gpu_tts.py tests/test_int8.py 2>&1 | tee "$OUT/gpu_tests.log"
fi
if has load; then
  timeout "${LOAD_TIMEOUT:-230}" python3 bench/tts_load.py --voice "$VOXLOOP_TTS__VOICE_PATH" --hardware h200 \
    --out "$OUT" --steps-report ${LOAD_ARGS:-} 2>&1 | tee "$OUT/load.log"
fi
if has load2; then  # a second configuration, rows appended to the same results file
  timeout "${LOAD2_TIMEOUT:-200}" python3 bench/tts_load.py --voice "$VOXLOOP_TTS__VOICE_PATH" --hardware h200 \
    --out "$OUT" --steps-report --append ${LOAD2_ARGS:-} 2>&1 | tee "$OUT/load2.log"
fi
if has profile; then
  timeout "${PROFILE_TIMEOUT:-170}" python3 bench/tts_gpu_profile.py --voice "$VOXLOOP_TTS__VOICE_PATH" --out "$OUT" \
    --wavs "$OUT/gpu_wavs.npz" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.log"
fi
if has memory; then  # device pool async vs native, request buffer pool on vs off, 50 clients
  timeout "${MEMORY_TIMEOUT:-300}" python3 bench/tts_memory.py --voice "$VOXLOOP_TTS__VOICE_PATH" --hardware h200 \
    --out "$OUT" ${MEMORY_ARGS:-} 2>&1 | tee "$OUT/memory.log"
fi
if has oom; then  # real CUDA out-of-memory under a memory limit, client backoff, recovery
  timeout "${OOM_TIMEOUT:-150}" python3 bench/tts_oom.py --voice "$VOXLOOP_TTS__VOICE_PATH" --hardware h200 \
    --out "$OUT" ${OOM_ARGS:-} 2>&1 | tee "$OUT/oom.log"
fi
if has int8; then  # INT8 decoder vs fp16/bf16/fp32: speed, first audio, SNR; audio for WER on the CPU machine
  timeout "${INT8_TIMEOUT:-300}" python3 bench/tts_int8.py --voice "$VOXLOOP_TTS__VOICE_PATH" --hardware h200 \
    --out "$OUT" ${INT8_ARGS:-} 2>&1 | tee "$OUT/int8.log"
fi
if has ws; then  # x.tts.speak over a loopback WebSocket to a TTS-only server on the cuda backend
  timeout "${WS_TIMEOUT:-300}" python3 bench/tts_load.py --mode ws --backends cuda --voice "$VOXLOOP_TTS__VOICE_PATH" \
    --hardware h200 --out "$OUT" --append ${WS_ARGS:-} 2>&1 | tee "$OUT/ws.log"
fi
if has experiments; then
  timeout "${EXP_TIMEOUT:-150}" python3 bench/tts_gpu_experiments.py --voice "$VOXLOOP_TTS__VOICE_PATH" --out "$OUT" \
    ${EXP_ARGS:-} 2>&1 | tee "$OUT/experiments.log"
fi
ls -la "$OUT"
