# Ten-step durable jobs: Rota beside DBOS and Absurd (both from PyPI, pinned
# here) on one PostgreSQL, in a virtualenv of their own (.venv-bench-durable),
# on the interpreter `make bench` uses (BENCH_PYTHON, mk/bench.mk: the worker
# image's 3.13 when the machine has it). Included by the main Makefile
# (`-include mk/*.mk`).
DURABLE_VENV := .venv-bench-durable
DURABLE_BIN := $(DURABLE_VENV)/bin
DURABLE_PEERS := dbos==3.4.0 absurd-sdk==0.5.1 absurdctl==0.5.1
DURABLE_STAMP := $(DURABLE_VENV)/.installed-$(shell echo '$(DURABLE_PEERS) $(BENCH_PYTHON)' | cat - pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
BENCH_DURABLE_ARGS ?=

$(DURABLE_STAMP): pyproject.toml constraints.txt mk/durable.mk
	$(call bench_venv,$(DURABLE_VENV),worker)
	$(DURABLE_BIN)/pip install --quiet $(DURABLE_PEERS)
	rm -f $(DURABLE_VENV)/.installed-* && touch $@

bench-durable: $(DURABLE_STAMP) ## ten-step durable jobs in Rota, DBOS and Absurd: step checkpoint p50/p99, steps/s, server CPU per step (BENCH_DURABLE_ARGS="--jobs 300")
	mkdir -p bench/results
	$(DURABLE_BIN)/python -m bench.durable_steps --json bench/results/durable.json $(BENCH_DURABLE_ARGS)
