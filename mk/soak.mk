# The long fault runs: the chaos soak's full plan, both failover scenarios, and
# the worker model (tests/worker/test_model.py) with many random examples.
# Included by the main Makefile (`-include mk/*.mk`); `make test` runs the short
# chaos plan and the cut-off failover only. Figures are printed and kept in
# each test's figures.json; ROTA_SOAK_SEED=<n> replays a chaos plan.
SOAK_JOBS ?= 20000
SOAK_SECONDS ?= 480
MODEL_EXAMPLES ?= 300

soak: $(STAMP) ## chaos soak (20000 jobs, about 40 faults; SOAK_JOBS, SOAK_SECONDS), both failovers, and the worker model long (MODEL_EXAMPLES, random)
	ROTA_SOAK=full ROTA_SOAK_JOBS=$(SOAK_JOBS) ROTA_SOAK_SECONDS=$(SOAK_SECONDS) \
	  $(BIN)/pytest -q -s -p no:cacheprovider tests/soak
	ROTA_MODEL_EXAMPLES=$(MODEL_EXAMPLES) ROTA_MODEL_RANDOM=1 \
	  $(BIN)/pytest -q -p no:cacheprovider tests/worker/test_model.py

.PHONY: soak
