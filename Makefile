# The two commands for a fresh machine: `make setup`, then `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
ARCH ?= gfx942
# torch is pinned to the CPU build 2.13.0 that ships as a local wheel on the build hosts;
# a looser pin would download a multi-GB GPU build.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test test-rocm build wheel dist lint clean

setup: $(BIN)/mono-aot

$(BIN)/mono-aot: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=...)" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[build,dev]" "$(TORCH_PIN)"
	@touch $@

test: setup
	$(BIN)/python -m pytest -q

# On an MI300X / MI355X box with a ROCm build of torch already in .venv
# (make setup TORCH_PIN=torch keeps it): the GPU tests, then the kernels' selftest.
test-rocm: setup
	$(BIN)/python -m pytest -q -m rocm
	$(BIN)/mono-aot selftest

build: setup
	$(BIN)/mono-aot build --arch $(ARCH)

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
	rm -rf $(VENV) artifacts/* .pytest_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
