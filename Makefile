# Ballast: the whole set-up on a fresh machine is `make run` (a demo fleet doing real work)
# and `make test` (everything CI runs). Each target builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench scenarios protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@# Envoys start by fork+exec; gRPC's fork handlers would only log noise about it.
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m control_plane.app.demo examples/desired.yaml

test: $(STAMP)
	deploy/ensure-test-services.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=20

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
