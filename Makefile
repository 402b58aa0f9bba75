# `make demo`, `make test` and `make bench` create .venv and install xnnguard into it on first use;
# afterwards the stamp file makes them skip the install until pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.xnnguard-installed

.PHONY: demo lint test test-all bench fuzz compat clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m xnnguard.demo

# ruff, then mypy over the package (configured in pyproject.toml); `make test` runs it first.
lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m mypy

# The suite runs one pytest-xdist worker per core: most of a test is single-threaded export and lowering.
# loadgroup: tests that share a session fixture (an xdist_group) run on one worker, so it is built once.
# TIER picks the tests by marker (docs/testing.md): `make test` runs every tier but slow, `make test-all` all.
TIER ?= not slow
test: $(STAMP) lint
	$(PY) -m pytest -q -n auto --dist loadgroup -m "$(TIER)" $(PYTEST_ARGS)

test-all: $(STAMP) lint
	$(PY) -m pytest -q -n auto --dist loadgroup $(PYTEST_ARGS)

# `make bench` also times xnnguard's programs against ONNX Runtime and LiteRT (benchmarks/bench_peers.py):
# ONNX Runtime from the `bench` extra in .venv; LiteRT in a venv of its own, because litert-torch pins
# typing_extensions below what ExecuTorch's dependencies ask. Both are built on first use, like .venv.
# PEERS_SIZE=full times the zoo at its published sizes too (long); PEERS_ARGS passes more arguments.
BENCH_STAMP := $(VENV)/.xnnguard-bench-installed
LITERT_VENV := .venv-litert
LITERT_PACKAGES := litert-torch==0.10.0
LITERT_STAMP := $(LITERT_VENV)/.litert-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[test,bench]'
	@touch $@

# torch 2.13.0 first, from this machine's CPU wheel: litert-torch asks torch<2.15, and an unpinned torch
# would bring a CUDA build of several GB.
$(LITERT_STAMP): Makefile
	@test -x $(LITERT_VENV)/bin/python || $(PYTHON) -m venv $(LITERT_VENV)
	$(LITERT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LITERT_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(LITERT_VENV)/bin/python -m pip install --quiet $(LITERT_PACKAGES) torch==2.13.0
	@touch $@

bench: $(BENCH_STAMP) $(LITERT_STAMP)
	XNNGUARD_LITERT_PYTHON=$(LITERT_VENV)/bin/python $(PY) -m benchmarks

# `make fuzz`: random networks of the domain (testbed/fuzz), each seed in every mode (float32, fp16, static
# and dynamic int8, a dynamic batch), each program in a child process; writes fuzz-out/report.md and a
# repro per finding. Long: FUZZ_SEEDS=50 (a count), 100-199 or 3,7,9; FUZZ_MODES=fp16,float32; FUZZ_JOBS
# programs at a time; FUZZ_ARGS=--resume continues a stopped run.
FUZZ_SEEDS ?= 500
FUZZ_MODES ?= all
FUZZ_JOBS ?= 1
fuzz: $(STAMP)
	$(PY) -m testbed.fuzz --seeds $(FUZZ_SEEDS) --modes $(FUZZ_MODES) --jobs $(FUZZ_JOBS) --out fuzz-out $(FUZZ_ARGS)

# `make compat`: the test suite on every supported ExecuTorch release, one venv each under .venv-compat/
# (built once, then reused until pyproject.toml changes; torch 2.13.0 from this machine's wheel, as in
# .venv). COMPAT_RELEASES=1.4.0 runs one; TIER picks the tests by marker (`TIER=release_sensitive`: what
# differs between releases); PYTEST_ARGS passes arguments to each pytest run. A test of a behaviour a
# release lacks is skipped there with the reason (tests/compat_marks.py).
COMPAT_RELEASES ?= 1.4.0 1.4.1 1.5.0 1.5.1
COMPAT_DIR := .venv-compat

$(COMPAT_DIR)/%/.xnnguard-installed: pyproject.toml
	@test -x $(COMPAT_DIR)/$*/bin/python || $(PYTHON) -m venv $(COMPAT_DIR)/$*
	$(COMPAT_DIR)/$*/bin/python -m pip install --quiet --upgrade pip
	$(COMPAT_DIR)/$*/bin/python -m pip install --quiet torch==2.13.0
	$(COMPAT_DIR)/$*/bin/python -m pip install --quiet -e '.[test]' executorch==$*
	@touch $@

compat: $(foreach release,$(COMPAT_RELEASES),$(COMPAT_DIR)/$(release)/.xnnguard-installed)
	@failed=""; for release in $(COMPAT_RELEASES); do \
	  echo "=== ExecuTorch $$release"; \
	  $(COMPAT_DIR)/$$release/bin/python -m pytest -q -n auto --dist loadgroup -p no:cacheprovider -m "$(TIER)" \
	    $(PYTEST_ARGS) \
	    || failed="$$failed $$release"; \
	done; \
	if [ -n "$$failed" ]; then echo "make compat: failures on ExecuTorch$$failed"; exit 1; fi; \
	echo "make compat: passed on ExecuTorch $(COMPAT_RELEASES)"

clean:
	rm -rf $(VENV) $(COMPAT_DIR) $(LITERT_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache fuzz-out
