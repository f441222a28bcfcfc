# The benchmark: Rota against pgqueuer (asyncio and uvloop) and procrastinate on
# one PostgreSQL, and the sustained-load soak. Included by the main Makefile
# (`-include mk/*.mk`).
#
# The peers are pinned here so that numbers from different runs compare; they
# are installed into .venv on first use, beside Rota's own dependencies.
# uvloop is pgqueuer's fastest setup (its `pgq run` uses it when installed).
BENCH_PEERS := pgqueuer==1.6.0 procrastinate==3.10.0 asyncpg==0.32.0 uvloop==0.23.0
BENCH_STAMP := $(VENV)/.bench-$(shell echo '$(BENCH_PEERS)' | cksum | cut -d' ' -f1)
BENCH_ARGS ?=
SOAK_ARGS ?=
CHURN_ARGS ?=

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt $(BENCH_PEERS)
	rm -f $(VENV)/.bench-* && touch $@

bench: $(BENCH_STAMP) ## Rota against pgqueuer (asyncio, uvloop): drain, server CPU, WAL, commits, latency (about 5 minutes; BENCH_ARGS="--quick", "--rounds 3" or "--help")
	mkdir -p bench/results
	$(BIN)/python -m bench.run --json bench/results/latest.json $(BENCH_ARGS)

bench-findings: $(STAMP) ## the plan and round-trip experiments behind bench/FINDINGS.md (about 3 minutes)
	mkdir -p bench/results
	$(BIN)/python -m bench.findings --json bench/results/findings.json

soak-load: $(STAMP) ## steady enqueue and drain for 20 minutes with archiving on, sampled every 30 s (SOAK_ARGS="--minutes 5")
	mkdir -p bench/results
	$(BIN)/python -m bench.soak_load --json bench/results/soak-load.json $(SOAK_ARGS)

bench-churn: $(BENCH_STAMP) ## Rota and pgqueuer under churn, with a REPEATABLE READ snapshot held, then released (about 15 minutes; CHURN_ARGS="--scale 0.5", "--quick" or "--help")
	mkdir -p bench/results
	$(BIN)/python -m bench.churn --json bench/results/churn.json $(CHURN_ARGS)

.PHONY: bench bench-churn bench-findings soak-load
