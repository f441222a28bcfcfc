# The web console: its benchmark, and the pinned front-end file it serves.
# Included by the main Makefile (`-include mk/*.mk`).

WEB_BENCH_ARGS ?=
HTMX_VERSION := 2.0.11

bench-web: $(STAMP) ## time every console page with 1,000,000 jobs in the table (about 3 minutes; WEB_BENCH_ARGS="--help")
	mkdir -p bench/results
	$(BIN)/python -m bench.web_pages --json bench/results/web-latest.json $(WEB_BENCH_ARGS)

web-screenshots: $(STAMP) ## retake docs/console-*.png and docs/screenshots/ with the browser tests (needs chromium)
	ROTA_WEB_SCREENSHOTS=1 $(BIN)/pytest -q tests/web/test_browser.py tests/web/test_browser_pages.py

web-assets: ## fetch the pinned htmx from the npm registry into rota/web/static (checked by tests/web)
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent htmx.org@$(HTMX_VERSION) >/dev/null && \
	  tar xzf htmx.org-$(HTMX_VERSION).tgz && cd - >/dev/null && \
	  cp $$tmp/package/dist/htmx.min.js rota/web/static/htmx.min.js && \
	  cp $$tmp/package/LICENSE rota/web/static/htmx.LICENSE.txt && rm -rf $$tmp

.PHONY: bench-web web-screenshots web-assets
