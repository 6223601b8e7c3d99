# gpuwarden developer entry points. `make dev` once, then `make demo` / `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PKGS := -e shared -e services/collector -e services/slurm-watcher -e services/correlator \
        -e services/detector -e services/otlp-bridge -e services/remediator -e services/health-check -e services/console -e .

.PHONY: dev demo test test-unit test-integration check lint schemas kafka-fetch clean

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

## test: the whole suite (unit + integration on real Apache Kafka and a real Slurm)
test: dev
	$(BIN)/python -m pytest -q tests

test-unit: dev
	$(BIN)/python -m pytest -q -m "not integration" tests

check: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared/src services/*/src src
	$(BIN)/python -m pytest -q tests

schemas: dev
	$(BIN)/gpuwarden schemas --out docs/schemas

kafka-fetch:
	bash deploy/kafka.sh fetch

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
