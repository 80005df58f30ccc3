# Ballast: the whole set-up on a fresh machine is `make run` (a demo fleet doing real work)
# and `make test` (everything CI runs). Each target builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# `make run` ports (the demo's Ballast and its first Envoy's admin; the next PoPs count up)
XDS_PORT ?= 18000
ADMIN_PORT ?= 18001
ENVOY_ADMIN_PORT ?= 9901
DEMO_STATE ?= var/demo

.PHONY: run reset test unit e2e-hosts lint bench scenarios protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@# Envoys start by fork+exec; gRPC's fork handlers would only log noise about it.
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m harness.demo examples/desired.yaml \
		--state-dir $(DEMO_STATE) --xds-port $(XDS_PORT) --admin-port $(ADMIN_PORT) \
		--envoy-admin-port $(ENVOY_ADMIN_PORT)

# The demo resumes its last weights and decision log; this starts it from a clean state.
reset:
	rm -rf $(DEMO_STATE)
	@echo "removed $(DEMO_STATE): the next make run starts from the desired state's weights"

test: $(STAMP)
	deploy/ensure-test-services.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=20

# The pure rooms' tests (desired/, translate/, decide/: no I/O, no peers) and the house rules
# (imports, words, waits, function length), for a quick loop while editing; `make test` stays
# the whole suite.
PURE_ROOMS := desired translate decide
HOUSE_RULES := tests/test_rooms.py tests/test_glossary.py tests/test_waits.py \
	tests/test_function_length.py
UNIT_TESTS := $(HOUSE_RULES) $(sort $(wildcard $(PURE_ROOMS:%=tests/test_%_*.py)))
PEERS := envoy or prometheus or etcd or chromium or package
unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not ($(PEERS))" $(UNIT_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m bench.run

# the incident reports in docs/scenarios/ (every scenario, 3 interleaved runs per variant; give
# seeds not used before: make scenarios SEED=701)
SEED ?= 1
scenarios: $(STAMP)
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m bench.scenarios all --runs 3 --seed $(SEED)

protos: $(STAMP)
	$(BIN)/python -m control_plane.gen.build

clean:
	rm -rf $(VENV) var

# deploy/README.md's runbook on six hosts (network namespaces; root, 3-7 min): see
# tests/test_deploy_hosts.py
e2e-hosts: $(STAMP)
	deploy/ensure-test-services.sh
	BALLAST_E2E_HOSTS=1 GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m pytest -q \
		-p no:cacheprovider -s tests/test_deploy_hosts.py
