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

.PHONY: help setup run test test-llamacpp lint bench clean

help:
	@echo "make run    set up, then start Einsora Solo on this machine"
	@echo "make test   set up, then run the whole test suite"
	@echo "make test-llamacpp  the real llama.cpp tier (compiles llama-cpp-python once, ~5 min)"
	@echo "make lint   ruff, mypy (strict) and import-linter"
	@echo "make bench  run every benchmark in bench/"

$(CURDIR)/.tools/bin/uv:
	python3 -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/pip install --quiet uv

$(STAMP): $(UV) $(PACKAGE_FILES)
	$(UV) sync --all-packages --quiet
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/einsora solo

test: setup
	bash scripts/test-deps.sh
	$(BIN)/pytest

# llama-cpp-python compiles from source (~5 min on 2 cores, once: uv caches the wheel). The
# default set is restored after, so `make test` stays as it is.
test-llamacpp: setup
	$(UV) sync --all-packages --extra llamacpp --group llamacpp --quiet
	$(BIN)/pytest -m llamacpp tests/test_llamacpp.py; status=$$?; \
	  $(UV) sync --all-packages --quiet; exit $$status

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs services cli bench tests
	$(BIN)/lint-imports

bench: setup
	@set -e; for b in bench/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
