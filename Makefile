# `make demo`, `make test` and `make bench` create .venv and install xnnguard into it on first use;
# afterwards the stamp file makes them skip the install until pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.xnnguard-installed

.PHONY: demo lint test bench clean

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

test: $(STAMP) lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
