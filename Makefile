# gpuwarden developer entry points. `make dev` once, then `make demo` / `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PKGS := -e shared -e services/collector -e services/slurm-watcher -e services/correlator \
        -e services/detector -e services/otlp-bridge -e services/remediator -e services/health-check -e services/console -e .

.PHONY: dist wheelhouse lock dev prereqs demo test test-unit test-scored test-integration test-speed check lint docs schemas kafka-fetch clean

# the runtime dependencies at requirements.lock's versions (its pins, without the hashes, as
# constraints: editable installs cannot be hash-checked), as dist/ installs them
$(BIN)/gpuwarden: pyproject.toml shared/pyproject.toml services/*/pyproject.toml requirements-dev.txt requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	grep -E '^[A-Za-z0-9]' requirements.lock | sed 's/ .*//' > $(VENV)/lock-pins.txt
	$(BIN)/pip install -q -c $(VENV)/lock-pins.txt $(PKGS) -r requirements-dev.txt
	touch $@

## dev: create .venv with every package (editable) and the test tools
dev: $(BIN)/gpuwarden

## demo: simulated 8-node H100 fleet, XID 79 on one GPU, end to end on an embedded broker
demo: dev
	$(BIN)/gpuwarden demo --report demo-report.json

## prereqs: the Debian packages, Java and Maven the tests need (deploy/install-test-prereqs.sh; root when any is missing)
prereqs:
	bash deploy/install-test-prereqs.sh

## test: the whole suite (unit + scored scenarios + integration on real Apache Kafka and a real Slurm)
test: dev prereqs
	$(BIN)/python -m pytest -q tests

## test-unit: the fast layer (about a minute): no broker, no Slurm, no scored scenario runs
test-unit: dev prereqs
	$(BIN)/python -m pytest -q -m "not integration and not scored" tests

## test-scored: the scored scenario suite (every tests/scenarios/*.yaml run in-process and scored)
test-scored: dev
	$(BIN)/python -m pytest -q -m "scored and not integration" tests

## test-integration: real Apache Kafka (or Tansu), real Slurm (root), real OTLP/Prometheus servers
test-integration: dev prereqs
	$(BIN)/python -m pytest -q -m integration tests

## test-speed: every tests/scenarios/*.yaml through the real services at --speed 5 and 50 under a CPU hog:
## the same failure ids and a passing score at both (4 scenarios at a time: 132 took 74 min on 2 cores; SPEEDCHECK_ARGS="--jobs 1" for one)
SPEEDCHECK_ARGS ?= --jobs 4
test-speed: dev
	$(BIN)/python -m gpuwarden.sim.speedcheck --hog $(SPEEDCHECK_ARGS) tests/scenarios/*.yaml

## lint: ruff (lint + format check) and mypy over every package
lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared/src services/*/src src

## check: lint, then the whole suite
check: lint test

## docs: regenerate the generated parts of docs/ and the READMEs (topics and settings tables)
docs: dev
	$(BIN)/python -m gpuwarden.docgen

schemas: dev
	$(BIN)/gpuwarden schemas --out docs/schemas

kafka-fetch:
	bash deploy/kafka.sh fetch

## dist: wheel + sdist of every package into dist/ (with their hashes, the lock and the install script)
dist: dev
	rm -rf dist
	PY=$(BIN)/python bash deploy/build-dist.sh dist dist

## wheelhouse: the files of requirements.lock into wheelhouse/, checked against its hashes (network)
wheelhouse: dev
	PY=$(BIN)/python bash deploy/build-dist.sh wheelhouse wheelhouse

## lock: regenerate requirements.in (from the pyproject.toml files) and requirements.lock (hashes)
lock: dev
	$(BIN)/python deploy/requirements-in.py > requirements.in
	$(BIN)/pip-compile --quiet --upgrade --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	    --no-emit-find-links --output-file requirements.lock requirements.in

clean:
	rm -rf dist wheelhouse $(VENV) .pytest_cache .mypy_cache .ruff_cache
