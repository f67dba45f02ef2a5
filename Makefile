# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
# tests wait on real processes (hubs, databases, browsers) as much as they compute: two workers
TEST_WORKERS ?= 2

.PHONY: demo test lint typecheck unit bench clean system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuscope demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench eval
	$(BIN)/ruff format --check src tests bench eval

typecheck: $(STAMP)
	$(BIN)/mypy

system-deps:
	./scripts/system-deps.sh

unit: $(STAMP) system-deps
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test: lint typecheck unit

bench: $(STAMP) system-deps
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
