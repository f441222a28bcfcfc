# Rota's Makefile documents itself: `make help` lists every target with the
# text after its `##`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.DEFAULT_GOAL := help

# `make help` lists what a newcomer runs first (FIRST), then the rest in the order
# the files define them.
FIRST := demo test install
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk -v first="$(FIRST)" 'BEGIN {FS = ":.*## "; n = split(first, order, " ")} \
	    !seen[$$1]++ {name[++count] = $$1; text[$$1] = $$2} \
	    END {for (i = 1; i <= n; i++) if (order[i] in text) {show(order[i]); done[order[i]] = 1} \
	         for (i = 1; i <= count; i++) if (!(name[i] in done)) show(name[i])} \
	    function show(t) {printf "  \033[36m%-16s\033[0m %s\n", t, text[t]}'

# $(call first_python,MINOR,MORE): the first interpreter that really runs and is
# 3.MINOR or later, of Python 3.13, then 3.12 (pyenv's versions before the PATH's:
# a pyenv shim exists for every installed version but fails unless that version
# is selected), then MORE; empty when none is. Used with `?=` and then `:=`, it
# runs once per make run.
NEWER_PYTHONS := $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python) python3.13 \
  $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) python3.12
first_python = $(shell for p in $(NEWER_PYTHONS) $(2); do \
  $$p -c 'import sys; sys.exit(sys.version_info < (3, $(1)))' 2>/dev/null && { echo $$p; break; }; done)

# $(call debian_tool,COMMAND,PACKAGE,APT OPTIONS,TESTS): install Debian's PACKAGE
# unless COMMAND is found (on the PATH or in /usr/sbin, off a user's PATH), else
# say which TESTS will be skipped. shellcheck checks the kind script, Chromium
# runs the console's browser tests, Prometheus and promtool test the alerts and
# the dashboard's queries, PgBouncer stands in front of the pooler tests' server.
define debian_tool
@command -v $(1) >/dev/null || [ -x /usr/sbin/$(1) ] || { [ "$$(id -u)" = 0 ] && \
  command -v apt-get >/dev/null && \
  (apt-get update -qq && apt-get install -y -qq $(3) $(2)) >/dev/null 2>&1; } || \
  echo "note: $(2) not installed; $(4) will be skipped"
endef

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[worker,operator,web,dev]'
	@# Debian's packages for the tests that drive real tools, installed when we may
	@# (as root, with apt-get); without one, its tests are skipped.
	$(call debian_tool,shellcheck,shellcheck,,its test)
	$(call debian_tool,chromium,chromium,,the browser tests)
	$(call debian_tool,promtool,prometheus,--no-install-recommends,the promtool and Prometheus tests)
	$(call debian_tool,pgbouncer,pgbouncer,--no-install-recommends,the pooler tests)
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP) ## create .venv and install Rota with everything the tests need

test: $(STAMP) ## run the whole test suite (starts a throwaway PostgreSQL unless ROTA_TEST_DATABASE_URL is set)
	$(BIN)/pytest -q

lint: $(STAMP) ## ruff, mypy and the import layers
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The demo has a virtualenv of its own with only what it runs (the `demo` extra:
# the core, the console, an embedded PostgreSQL), not the development set.
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
DEMO_ARGS ?=

$(DEMO_STAMP): pyproject.toml constraints.txt
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet -c constraints.txt -e '.[demo]'
	rm -f $(DEMO_VENV)/.installed-* && touch $@

demo: $(DEMO_STAMP) ## run Rota on an embedded PostgreSQL with sample jobs, schedules and the console (Ctrl-C stops; DEMO_ARGS="--port 8081")
	$(DEMO_VENV)/bin/rota demo $(DEMO_ARGS)

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) $(DEMO_VENV) .venv-docs .pytest_cache .mypy_cache .ruff_cache

.PHONY: help install test lint fmt demo clean

-include mk/*.mk
