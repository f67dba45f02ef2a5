# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
# tests wait on real processes (hubs, databases, browsers, torchrun) as much as they compute: on two
# cores a third worker fills those waits
TEST_WORKERS ?= 3

.PHONY: demo test check deps lint typecheck unit bench eval clean system-deps

DEMO_STAMP := $(VENV)/.installed-demo
PIP_INSTALL := $(BIN)/pip install --constraint constraints.txt

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# the demo needs the hub extra only (about 250 MB); pip prints each package as it goes
$(DEMO_STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	@echo "installing gpuscope[hub] into $(VENV) (about 250 MB; the first time takes a minute or two)..."
	$(PIP_INSTALL) --progress-bar on -e '.[hub]'
	touch $(DEMO_STAMP)

# tests, lint and typecheck: everything, developer tools and the real components of the tests included
$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	@echo "installing gpuscope[hub,dev] into $(VENV) (torch, transformers, playwright...: about 2 GB)..."
	$(PIP_INSTALL) --quiet -e '.[hub,dev]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/gpuscope demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench eval
	$(BIN)/ruff format --check src tests bench eval

typecheck: $(STAMP)
	$(BIN)/mypy

system-deps:
	./scripts/system-deps.sh

# modules in the order tests/conftest.py puts them: the long integration ones first, each module to
# one worker (its module fixtures set up once)
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

unit: $(STAMP) system-deps
	$(PYTEST)

test: lint typecheck unit

# the inner loop: lint, types and every test not marked `integration` (no real hubs, databases,
# TSDBs, browsers or fresh venvs; tests/conftest.py marks the fixtures that start them)
check: lint typecheck
	$(PYTEST) -m 'not integration'

# the Python packages and the Debian ones at the same time (`make -j2 deps`: .ci/run)
deps: $(STAMP) system-deps

bench: $(STAMP) system-deps
	$(PIP_INSTALL) --quiet -e '.[hub,dev,bench]'
	$(BIN)/python bench/run_all.py

# the evaluation job: every scenario, the long ones `make test` leaves out included (tests/scenarios/long,
# the healthy day), scored per rule family; minutes to an hour on two cores
eval: $(STAMP)
	$(BIN)/python eval/eval_families.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
