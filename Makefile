# gpuwarden developer entry points. `make dev` once, then `make demo` / `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PKGS := -e shared -e services/collector -e services/slurm-watcher -e services/correlator \
        -e services/detector -e services/otlp-bridge -e services/remediator -e services/health-check -e services/console -e .

.PHONY: dev demo test test-unit test-scored test-integration test-speed check lint docs schemas kafka-fetch clean

$(BIN)/gpuwarden: pyproject.toml shared/pyproject.toml services/*/pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(PKGS) -r requirements-dev.txt
	touch $@

## dev: create .venv with every package (editable) and the test tools
dev: $(BIN)/gpuwarden

## demo: simulated 8-node H100 fleet, XID 79 on one GPU, end to end on an embedded broker
demo: dev
	$(BIN)/gpuwarden demo --report demo-report.json

## test: the whole suite (unit + scored scenarios + integration on real Apache Kafka and a real Slurm)
test: dev
	$(BIN)/python -m pytest -q tests

## test-unit: the fast layer (about a minute): no broker, no Slurm, no scored scenario runs
test-unit: dev
	$(BIN)/python -m pytest -q -m "not integration and not scored" tests

## test-scored: the scored scenario suite (every tests/scenarios/*.yaml run in-process and scored)
test-scored: dev
	$(BIN)/python -m pytest -q -m "scored and not integration" tests

## test-integration: real Apache Kafka (or Tansu), real Slurm (root), real OTLP/Prometheus servers
test-integration: dev
	$(BIN)/python -m pytest -q -m integration tests

## test-speed: every tests/scenarios/*.yaml through the real services at --speed 5 and 50 under a CPU hog:
## the same failure ids and a passing score at both (hours: ~2 min per 300 s scenario; SPEEDCHECK_ARGS="--jobs 2")
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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
