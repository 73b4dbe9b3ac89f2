# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit bench bench-e2e histories clean codec-server

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/forge dev

demo: $(STAMP)
	$(BIN)/forge dev --demo

# `make run` already starts one; this is for a Temporal server Forge did not start.
codec-server: $(STAMP)
	$(BIN)/forge codec-server --allow-origin http://localhost:8233 --allow-origin http://localhost:8080

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: $(STAMP) lint typecheck
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	$(BIN)/pytest -q -ra

bench: $(STAMP)
	$(BIN)/python -m bench.placement --trace ../shared/data/alibaba-gpu-v2023

bench-e2e: $(STAMP)
	$(BIN)/python -m bench.e2e

histories: $(STAMP)
	$(BIN)/python -m tests.record_histories

clean:
	rm -rf $(VENV) .forge .pytest_cache .mypy_cache .ruff_cache
