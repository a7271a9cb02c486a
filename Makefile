# simlab: `make run` (default simulation) and `make test` (test suite) on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-all bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,gpu]'
	touch $(STAMP)

install: $(STAMP)

## Default simulation: the standard policy set on the paper's ShareGPT selection.
run: $(STAMP)
	$(BIN)/python -m simlab $(ARGS)

## Test suite (what CI runs).
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## Replay and timed-engine speed per policy on the real traces; writes bench/results/.
bench: $(STAMP)
	$(BIN)/python -m bench.speed $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check simlab policies traces gpu_validate tests bench examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .mypy_cache .ruff_cache
