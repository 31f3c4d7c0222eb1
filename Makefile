# The README's commands. Every target sets up what it needs first, so `make run` and
# `make test` work on a fresh machine with only Python 3.11+ and make.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# uv manages the workspace; where it is not installed, bootstrap it with pip into .tools/.
UV := $(or $(shell command -v uv 2>/dev/null),$(CURDIR)/.tools/bin/uv)
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.einsora-setup
PACKAGE_FILES := pyproject.toml $(wildcard uv.lock) $(wildcard libs/*/pyproject.toml services/*/pyproject.toml cli/pyproject.toml)

CONSOLE_DIR := services/proxy/console
CONSOLE_OUT := services/proxy/src/einsora/proxy/static/console/console.js
CONSOLE_SRC := $(wildcard $(CONSOLE_DIR)/src/*.js) $(CONSOLE_DIR)/package.json \
	$(CONSOLE_DIR)/package-lock.json $(CONSOLE_DIR)/build.mjs

.PHONY: help setup run test test-long test-llamacpp test-dashboard test-cluster test-engines \
	test-chaos lint bench clean dashboard dashboard-if-node dashboard-check dashboard-types console

help:
	@echo "make run    set up, then start Einsora Solo on this machine"
	@echo "make test   set up, then run the whole test suite"
	@echo "make test-long      the tests that take minutes of real time on purpose (~5 min)"
	@echo "make test-llamacpp  the real llama.cpp tier (compiles llama-cpp-python once, ~5 min)"
	@echo "make test-dashboard the dashboard in Chromium against a real Solo (needs Node 20+)"
	@echo "make dashboard      build the web dashboard (needs Node 20+; make setup does it)"
	@echo "make test-cluster   a 3-node NATS cluster: a node lost mid-burst, a scheduler failover"

	@echo "make test-engines   VMs on libvirtd (TCG) and containers on dockerd, as root"
	@echo "make test-chaos     a Lab cell under seeded faults, I1-I6 checked (the short form, ~2 min)"
	@echo "make console        build the VM console's terminal (xterm.js; needs npm)"
	@echo "make lint   ruff, mypy (strict) and import-linter"
	@echo "make bench  run every benchmark in bench/"

$(CURDIR)/.tools/bin/uv:
	python3 -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/pip install --quiet uv

$(STAMP): $(UV) $(PACKAGE_FILES)
	$(UV) sync --all-packages --quiet
	@touch $(STAMP)

setup: $(STAMP) dashboard-if-node $(CONSOLE_OUT)

# The dashboard (issue 18): a single-page app built by Vite into dashboard/dist, which the api
# serves at /. It needs Node 20.19+; without it, Solo runs without the dashboard and its
# greeting says how to build it. npm ci runs when the lock changes, the build when a source
# does (make's own timestamps: nothing is rebuilt otherwise).
NODE_OK := $(shell node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>20||(a===20&&b>=19)?0:1)' 2>/dev/null && echo yes)
DASHBOARD_MODULES := dashboard/node_modules/.package-lock.json
DASHBOARD_SOURCES := $(shell find dashboard/src dashboard/public -type f 2>/dev/null) \
	dashboard/index.html dashboard/vite.config.ts dashboard/tsconfig.json dashboard/package.json
DASHBOARD_BUILT := dashboard/dist/index.html

$(DASHBOARD_MODULES): dashboard/package-lock.json
	cd dashboard && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(DASHBOARD_BUILT): $(DASHBOARD_MODULES) $(DASHBOARD_SOURCES)
	cd dashboard && npm run --silent build
	@touch $@

dashboard:
ifeq ($(NODE_OK),yes)
	@$(MAKE) --no-print-directory -s $(DASHBOARD_BUILT)
else
	@echo "make dashboard: Node.js 20.19 or later is needed (https://nodejs.org); found: $$(node --version 2>/dev/null || echo none)" >&2
	@exit 1
endif

dashboard-if-node:
ifeq ($(NODE_OK),yes)
	@$(MAKE) --no-print-directory -s $(DASHBOARD_BUILT)
else
	@echo "note: no Node.js 20.19+ here, so the web dashboard is not built; Solo runs without it (make dashboard builds it)"
endif

# The dashboard's API types from the api's OpenAPI document: run after changing the API.
# tests/test_dashboard_types.py fails while they are stale.
dashboard-types: $(STAMP) $(DASHBOARD_MODULES)
	$(BIN)/python dashboard/scripts/openapi_snapshot.py
	cd dashboard && npm run --silent api-types

# Type check, the generated types against the document, and Vitest (seconds; make test runs it
# where Node is present).
dashboard-check: $(DASHBOARD_MODULES)
	cd dashboard && npx tsc --noEmit
	cd dashboard && npx openapi-typescript src/api/openapi.json --default-non-nullable false \
	  --output node_modules/.schema-check.d.ts --silent && \
	  cmp -s node_modules/.schema-check.d.ts src/api/schema.d.ts || \
	  { echo "dashboard/src/api/schema.d.ts is stale: run make dashboard-types" >&2; exit 1; }
	cd dashboard && npx vitest run

# The VM console's terminal (xterm.js) is bundled into the proxy's package from a package-lock'ed
# npm project; the built JS is not in git. Without npm (or a registry) the console page says its
# terminal is not built, and nothing else changes.
$(CONSOLE_OUT): $(CONSOLE_SRC)
	@if command -v npm >/dev/null 2>&1; then \
	  echo "building the VM console's terminal (npm ci, esbuild)..."; \
	  (cd $(CONSOLE_DIR) && npm ci --no-audit --no-fund --loglevel=error >/dev/null \
	    && npm run --silent build) \
	  || echo "note: the VM console's terminal could not be built (npm ci failed)" >&2; \
	else \
	  echo "note: no npm here: the VM console page will say its terminal is not built" >&2; \
	fi

console:
	cd $(CONSOLE_DIR) && npm ci --no-audit --no-fund --loglevel=error && npm run build

run: setup
	$(BIN)/einsora solo

test: setup
	bash scripts/test-deps.sh
ifeq ($(NODE_OK),yes)
	@$(MAKE) --no-print-directory dashboard-check
endif
	$(BIN)/pytest

# Tests that wait minutes of real time on purpose (a store outage, a minute of silence), so the
# default run stays quick; .ci/run runs them.
test-long: setup
	$(BIN)/pytest -m long

# The dashboard in Chromium against a real Solo (slow: a real notebook, every page at two
# widths in two colour schemes, axe-core on each); screenshots go to artifacts/dashboard/.
test-dashboard: setup dashboard
	bash scripts/test-deps.sh
	@$(MAKE) --no-print-directory dashboard-check
	$(BIN)/pytest -m dashboard tests/test_dashboard.py

# llama-cpp-python compiles from source (~5 min on 2 cores, once: uv caches the wheel). The
# default set is restored after, so `make test` stays as it is.
test-llamacpp: setup
	$(UV) sync --all-packages --extra llamacpp --group llamacpp --quiet
	$(BIN)/pytest -m llamacpp tests/test_llamacpp.py; status=$$?; \
	  $(UV) sync --all-packages --quiet; exit $$status

# A real 3-node NATS cluster, Postgres and the services (~1 min): a node SIGKILLed in the middle
# of a 500-launch burst, and a standby scheduler taking over from a SIGKILLed leader.
test-cluster: setup
	bash scripts/test-deps.sh
	$(BIN)/pytest -m cluster tests/test_cluster.py -s

# VMs and containers on real engines (issue 21): libvirtd and dockerd started by hand as root,
# the tiny guest and the stub image built once into ~/.cache/einsora-engines. libvirt-python
# (the agent's `libvirt` extra) compiles against libvirt-dev; the default set is restored after.
test-engines: setup
	bash scripts/engine-deps.sh
	$(UV) sync --all-packages --extra libvirt --quiet
	EINSORA_UV=$(UV) $(BIN)/pytest -m engines services/agent/tests tests; status=$$?; \
	  $(UV) sync --all-packages --quiet; exit $$status

# Our own chaos suite's short form (issue 35, ~2 min): a Lab cell of processes (3 NATS nodes,
# Postgres, api, 2 schedulers, accounting, sim and joined agents), 300 launches under 6 seeded
# faults, then I1-I6 from the bus's own record. EINSORA_CHAOS_SEED picks the seed; the long
# form is `bench/chaos.py --long --seeds 3`.
test-chaos: setup
	$(BIN)/pytest -m chaos tests/chaos -s

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs services cli bench tests
	$(BIN)/lint-imports
ifeq ($(NODE_OK),yes)
	@$(MAKE) --no-print-directory -s $(DASHBOARD_MODULES)
	cd dashboard && npx tsc --noEmit
else
	@echo "note: no Node.js 20.19+ here, so the dashboard's TypeScript is not checked" >&2
endif

bench: setup
	@set -e; for b in bench/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache .import_linter_cache \
	  dashboard/node_modules dashboard/dist
