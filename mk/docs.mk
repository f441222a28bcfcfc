# The docs site: MkDocs with Material, pages in docs/, nav in mkdocs.yml.
# Included by the main Makefile (`-include mk/*.mk`). The site has a virtualenv
# of its own with only what it builds with (the core, which writes the CLI
# reference, and the `docs` extra, pinned in constraints.txt): not the
# development set of `make install`.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

$(DOCS_STAMP): pyproject.toml constraints.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/pip install --quiet -c constraints.txt -e '.[docs]'
	rm -f $(DOCS_VENV)/.installed-* && touch $@

docs: $(DOCS_STAMP) ## build the docs site into site/ (strict: a warning or a broken link fails)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --clean

docs-serve: $(DOCS_STAMP) ## serve the docs site on http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve --strict

.PHONY: docs docs-serve
