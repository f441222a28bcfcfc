# The docs site: MkDocs with Material, pages in docs/, nav in mkdocs.yml.
# Included by the main Makefile (`-include mk/*.mk`). The site's packages come
# from the `docs` extra, pinned in constraints.txt, into .venv beside the rest.
DOCS_STAMP := $(VENV)/.docs-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[docs]'
	rm -f $(VENV)/.docs-* && touch $@

docs: $(DOCS_STAMP) ## build the docs site into site/ (strict: a warning or a broken link fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean

docs-serve: $(DOCS_STAMP) ## serve the docs site on http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

.PHONY: docs docs-serve
