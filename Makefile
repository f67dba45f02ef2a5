# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
# Bytecode is written at first import (uv installs none, and the suite starts hundreds of Python
# processes: hubs, agents, torch ranks): an environment's PYTHONDONTWRITEBYTECODE would have each of
# them compile torch and the rest again (torch's import: 4.0 s of CPU instead of 1.7 s).
unexport PYTHONDONTWRITEBYTECODE
# tests wait on real processes (hubs, databases, browsers, torchrun) as much as they compute: on two
# cores a third worker fills those waits
TEST_WORKERS ?= 3

.PHONY: demo test check deps lint typecheck unit bench eval clean system-deps

DEMO_STAMP := $(VENV)/.installed-demo
# uv installs: it resolves, downloads and unpacks in parallel and leaves bytecode to the first import
# (a fresh `make -j2 deps`, same versions, same loaded machine: pip 7:56 and 129 s of CPU, uv 1:39
# and 21 s; uv compiling all bytecode at install, 5:00 and 86 s).
# uv does not read pip's configuration: pip's find-links (wheels on the machine's disk, such as a
# CPU-only torch) are passed on.
UV_VERSION := 0.13.8
UV := $(BIN)/uv
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
INSTALL = $(UV) pip install --python $(BIN)/python --constraint constraints.txt $(addprefix --find-links ,$(FIND_LINKS))

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(UV): | $(VENV)/bin/python
	$(BIN)/pip install --quiet uv==$(UV_VERSION)

# the demo needs the hub extra only (about 250 MB); uv shows its progress as it goes
$(DEMO_STAMP): pyproject.toml constraints.txt | $(UV)
	@echo "installing gpuscope[hub] into $(VENV) (about 250 MB; the first time takes a minute or less)..."
	$(INSTALL) -e '.[hub]'
	touch $(DEMO_STAMP)

# tests, lint and typecheck: everything, developer tools and the real components of the tests included
$(STAMP): pyproject.toml constraints.txt | $(UV)
	@echo "installing gpuscope[hub,dev] into $(VENV) (torch, transformers, playwright...: about 2 GB)..."
	$(INSTALL) --quiet -e '.[hub,dev]'
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

# lint and the type check run beside the tests: mypy on a fresh clone (no cache) is about 80 s of
# one core, which the tests' waits on real processes leave room for
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 lint typecheck unit

# the inner loop: lint, types and every test not marked `integration` (no real hubs, databases,
# TSDBs, browsers or fresh venvs; tests/conftest.py marks the fixtures that start them)
check: lint typecheck
	$(PYTEST) -m 'not integration'

# the Python packages and the Debian ones at the same time (`make -j2 deps`: .ci/run)
deps: $(STAMP) system-deps

bench: $(STAMP) system-deps
	$(INSTALL) --quiet -e '.[hub,dev,bench]'
	$(BIN)/python bench/run_all.py

# the evaluation job: every scenario, the long ones `make test` leaves out included (tests/scenarios/long,
# the healthy day), scored per rule family; minutes to an hour on two cores
eval: $(STAMP)
	$(BIN)/python eval/eval_families.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
