# The checks CI runs, one target each: `.ci/run` is `make ci`, so a target here is exactly what CI
# runs for it. Any target runs alone too (`make e2e`); the checks that need the toolgate binary
# build it first. TOOLGATE_BIN (default target/debug/toolgate) is passed on to the scripts.
SHELL := /bin/bash
export TOOLGATE_BIN ?= $(CURDIR)/target/debug/toolgate

CI_STEPS := deps lint fmt clippy test fuzz build sdk-python sdk-typescript k8s monitoring e2e soak schemathesis bench-quick

.PHONY: ci $(CI_STEPS)

ci:
	@set -e; for step in $(CI_STEPS); do \
		printf '\n=== make %s ===\n' "$$step"; \
		$(MAKE) --no-print-directory "$$step"; \
	done; printf '\n=== all green ===\n'

# Debian packages (Redis, Prometheus, nginx, wrk, shellcheck, python3-venv) and the .venv of
# scripts/requirements.txt.
deps:
	scripts/install-deps.sh all

# The Python tools' unit tests: scripts/ needs the .venv's packages; bench/ and deploy/ need none.
lint:
	scripts/install-deps.sh lint
	$${TOOLGATE_VENV:-.venv}/bin/ruff check scripts deploy bench
	shellcheck -x scripts/*.sh bench/run.sh deploy/kind/e2e.sh .ci/run
	scripts/check_docs.py --self-test
	scripts/check_docs.py
	scripts/check_layers.py --self-test
	scripts/check_layers.py
	scripts/check_readme.py --self-test
	python3 -m unittest discover -s bench
	$${TOOLGATE_VENV:-.venv}/bin/python -m unittest discover -s scripts
	python3 -m unittest discover -s deploy/kind
	python3 -m unittest discover -s deploy/scenario

fmt:
	cargo fmt --all -- --check

clippy:
	cargo clippy --locked --all-targets -p toolgate -p toolgate-alloc -- -D warnings

test:
	scripts/test.sh

# Every cargo fuzz target for 60 s from its committed corpus (fuzz/README.md); installs
# cargo-fuzz when missing. FUZZ_SECONDS changes the time per target. Its release build with
# AddressSanitizer is the longest step of CI (about 10 minutes on two cores).
fuzz:
	scripts/fuzz.sh --seconds $${FUZZ_SECONDS:-60}

build:
	cargo build --locked --bin toolgate --example fake_tool --example redis_cluster

# The Python SDK (clients/python): ruff, mypy --strict and pytest against the real sidecar, with
# the framework releases pinned in clients/python/requirements-test.txt (scripts/sdk-python.sh).
sdk-python: build
	scripts/sdk-python.sh

# The TypeScript SDK (clients/typescript): npm ci, tsc, biome and node --test against the real
# sidecar (scripts/sdk-typescript.sh).
sdk-typescript: build
	scripts/sdk-typescript.sh
	scripts/check_readme.py

k8s: build
	scripts/k8s-check.sh

monitoring: build
	scripts/monitoring-check.sh

e2e: build
	scripts/e2e-local.sh

# The running sidecar against docs/openapi.yaml, which it serves as GET /openapi.json: schemathesis
# on both listeners, plus probes (scripts/schemathesis_check.py).
schemathesis: build
	scripts/schemathesis-check.sh

# Two minutes of steady mixed load per store (memory, then Redis Cluster with a primary killed
# at mid-soak): RSS growth, every answer's code, every record and the facts.
soak: build
	scripts/soak.sh --minutes 2

bench-quick:
	bench/run.sh --quick
