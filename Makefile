# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit docs bench bench-e2e histories mutations clean codec-server

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
	bash scripts/ensure-tools.sh
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	$(BIN)/pytest -q -ra

# The documentation site (mkdocs.yml, docs/) into site/; the suite builds it too
# (tests/system/test_docs.py), so a broken link fails `make test`.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python -m bench.placement --trace ../shared/data/alibaba-gpu-v2023

bench-e2e: $(STAMP)
	$(BIN)/python -m bench.e2e

# Re-record tests/histories/: the time-skipping set and the dev-server set (SQLite and
# PostgreSQL stores, real worker.py processes); about a minute.
histories: $(STAMP)
	bash scripts/ensure-postgres.sh
	$(BIN)/python -m tests.record_histories

# Plant each bug in tests/mutations/*.patch in a copy of the tree; 0 only if all are caught.
mutations: $(STAMP)
	$(BIN)/python -m tests.mutations.run

clean:
	rm -rf $(VENV) .forge .pytest_cache .mypy_cache .ruff_cache
