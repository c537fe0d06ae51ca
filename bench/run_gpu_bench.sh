#!/usr/bin/env bash
# GPU TTS checks + profile + load benchmark on a CUDA host (the lent H200 box: python3 with
# torch/onnx/onnxruntime, no PyPI). The voice (.onnx + .json) and a soxr wheel travel in
# .devcarry/ (git-ignored). Stages (comma list, run in this order): tests, load, load2 (a second
# configuration, e.g. LOAD2_ARGS="--compile"), profile, experiments; or all. Results in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_bench}
STAGES=${1:-all}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VOXLOOP_TTS__VOICE_PATH="$PWD/.devcarry/en_US-joe-medium.onnx"
if [ -d .devcarry/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, onnx, onnxruntime, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, onnx.__version__, onnxruntime.__version__)"
has() { [ "$STAGES" = all ] || [[ ",$STAGES," == *",$1,"* ]]; }
if has tests; then
  timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -x -q -s -p no:cacheprovider tests/test_gpu_tts.py 2>&1 | tee "$OUT/gpu_tests.log"
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
if has experiments; then
  timeout "${EXP_TIMEOUT:-150}" python3 bench/tts_gpu_experiments.py --voice "$VOXLOOP_TTS__VOICE_PATH" --out "$OUT" \
    ${EXP_ARGS:-} 2>&1 | tee "$OUT/experiments.log"
fi
ls -la "$OUT"
