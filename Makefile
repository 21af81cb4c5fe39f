# Berth: `make demo` and `make test` work on a fresh machine (Python 3.11, Node 20, npm).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: all install synth lint typecheck test test-unit test-functional test-infra test-e2e fuzz demo up openapi bench-api bench-replay chaos clean

all: install

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==26.3

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[control-plane,cli,agent,infra,local,dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(VENV)/.installed node_modules/.installed

# The CloudFormation template: the one that goes to AWS is the one the local cloud deploys. It depends
# on the install stamps (real files, not the phony `install`), on every file of the CDK app and of the
# Lambda asset, and on cdk.json and pyproject.toml (the bundling reads it): a second `make up` or
# `make demo` with nothing changed does not synthesise again.
SYNTH_SOURCES := $(shell find infra functions -type f -not -path '*/__pycache__/*' -not -name '*.pyc') cdk.json pyproject.toml
cdk.out/Berth.template.json: $(VENV)/.installed node_modules/.installed $(SYNTH_SOURCES)
	npx cdk synth --quiet > /dev/null
	touch $@

synth: cdk.out/Berth.template.json

# The console's browser test (tests/e2e/test_console_e2e.py) drives Debian's chromium (Playwright's own
# browser download is not used). Installed as root; otherwise that test fails and says how to install it.
/usr/bin/chromium:
	@if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "chromium is missing and this is not root: run 'apt-get install -y chromium' as root" >&2; fi

lint: install
	$(BIN)/ruff check functions tools agent infra tests
	$(BIN)/ruff format --check functions tools agent infra tests
	$(BIN)/mypy functions tools infra
	$(BIN)/lint-imports

# Two workers (pytest-xdist): the end-to-end tests, which mostly wait on their local cloud, in one;
# the rest of the suite beside them (tests/conftest.py groups what shares a fixture).
PYTEST_WORKERS ?= 2
test: install synth lint /usr/bin/chromium
	$(BIN)/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadscope --durations=25 tests

test-unit: install
	$(BIN)/pytest -q tests/unit

# Every test target makes what its tests need (the local cloud's functional tests deploy the
# synthesised template); a test that finds it missing fails with a message, it never skips.
test-functional: install synth
	$(BIN)/pytest -q tests/functional

test-infra: install synth
	$(BIN)/pytest -q tests/infra

test-e2e: install synth /usr/bin/chromium
	$(BIN)/pytest -q tests/e2e

# The long form of the OpenAPI fuzz run that `make test` runs short (tests/functional/test_openapi_fuzz.py).
fuzz: install
	BERTH_FUZZ_EXAMPLES=$${BERTH_FUZZ_EXAMPLES:-300} $(BIN)/pytest -q -p no:cacheprovider tests/functional/test_openapi_fuzz.py

demo: install synth
	$(BIN)/python -m berth_tools.demo

# Ten minutes of seeded faults on a fresh local cloud (docs/operations.md, "Chaos"); `make test` runs
# a 90 s form (tests/e2e/test_chaos_short.py).
chaos: install synth
	$(BIN)/berth bench chaos --minutes 10 --seed 1

up: install synth
	$(BIN)/berth local up

# The local cloud under load (docs/local-cloud.md): N submits from C clients against a fresh
# `berth local up`; prints throughput, p50/p99, lost/duplicated and the process's RSS growth per submit.
BENCH_N ?= 1000
BENCH_C ?= 32
bench-api: install synth
	@state=$$(mktemp -d); \
	$(BIN)/berth local up --state-dir $$state --quiet > $$state/up.log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf $$state' EXIT; \
	for i in $$(seq 120); do [ -f $$state/env ] && break; kill -0 $$pid 2>/dev/null || break; sleep 0.5; done; \
	[ -f $$state/env ] || { cat $$state/up.log; echo "berth local up did not become ready" >&2; exit 1; }; \
	. $$state/env && AWS_PROFILE=alice $(BIN)/berth bench api -n $(BENCH_N) -c $(BENCH_C) --output json

# `berth sim` and the real service on one trace (docs/cloud.md, "Simulator and service agree"): the
# local cloud with real agents and local Batch, time compressed by REPLAY_FACTOR (about 6 minutes).
REPLAY_TRACE ?= examples/traces/tiresias-60.csv
REPLAY_FACTOR ?= 10
bench-replay: install synth
	$(BIN)/berth bench replay --trace $(REPLAY_TRACE) --cluster examples/clusters/replay-a10g.yaml --factor $(REPLAY_FACTOR) --output json

openapi: install
	$(BIN)/python -m berth.handlers.openapi > docs/openapi.json

clean:
	rm -rf cdk.out .berth .mypy_cache .ruff_cache .pytest_cache
