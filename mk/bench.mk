# The benchmark: Rota against pgqueuer and procrastinate on one PostgreSQL.
# Included by the main Makefile (`-include mk/*.mk`).
#
# The peers are pinned here so that numbers from different runs compare; they
# are installed into .venv on first use, beside Rota's own dependencies.
BENCH_PEERS := pgqueuer==1.6.0 procrastinate==3.10.0 asyncpg==0.32.0
BENCH_STAMP := $(VENV)/.bench-$(shell echo '$(BENCH_PEERS)' | cksum | cut -d' ' -f1)
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt $(BENCH_PEERS)
	rm -f $(VENV)/.bench-* && touch $@

bench: $(BENCH_STAMP) ## measure Rota against pgqueuer and procrastinate, print a table (about 3 minutes; BENCH_ARGS="--help")
	mkdir -p bench/results
	$(BIN)/python -m bench.run --json bench/results/latest.json $(BENCH_ARGS)

.PHONY: bench
