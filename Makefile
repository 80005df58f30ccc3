# Ballast: the whole set-up on a fresh machine is `make run` (a demo fleet doing real work)
# and `make test` (everything CI runs). Each target builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test unit lint bench scenarios protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@# Envoys start by fork+exec; gRPC's fork handlers would only log noise about it.
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m harness.demo examples/desired.yaml

test: $(STAMP)
	deploy/ensure-test-services.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=20

# The pure rooms' tests (desired/, translate/, decide/: no I/O, no peers) and the import rules,
# for a quick loop while editing; `make test` stays the whole suite.
PURE_ROOMS := desired translate decide
UNIT_TESTS := tests/test_rooms.py $(sort $(wildcard $(PURE_ROOMS:%=tests/test_%_*.py)))
PEERS := envoy or prometheus or etcd or chromium or package
unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not ($(PEERS))" $(UNIT_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m bench.run

# the incident reports in docs/scenarios/ (every scenario, 3 interleaved runs per variant)
scenarios: $(STAMP)
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m bench.scenarios all --runs 3

protos: $(STAMP)
	$(BIN)/python -m control_plane.gen.build

clean:
	rm -rf $(VENV) var
