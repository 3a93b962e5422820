# Two commands for a fresh machine: `make serve` (set up, then run) and `make test`.
# Setup is one venv with pinned dependencies; torch is the CPU wheel 2.13.0.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup sysdeps serve test lint bench clean k8s

# Debian packages whose command (same name) some tests need: prometheus answers the
# Grafana dashboard's queries in tests/integration/test_prometheus.py. Installed when
# running as root with apt-get (CI); elsewhere those tests skip and say how to install.
SYSDEPS := prometheus

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,embeddings]"
	touch $(STAMP)

setup: $(STAMP) sysdeps

sysdeps:
	@missing=""; for p in $(SYSDEPS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "note:$$missing not installed (not root, or no apt-get): their tests will skip"; exit 0; fi; \
	policy=/usr/sbin/policy-rc.d; made=""; \
	if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' > $$policy; chmod +x $$policy; made=1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $$missing; } || \
	  echo "note: could not install$$missing: their tests will skip"; \
	if [ -n "$$made" ]; then rm -f $$policy; fi

serve: $(STAMP)
	$(BIN)/raybatch up

lint: $(STAMP)
	$(BIN)/ruff check .

test: sysdeps lint
	$(BIN)/python -m pytest -q

# The manifests checked in under k8s/, rendered from the configs they name (a test fails
# when they drift from what the renderer makes of those configs now).
k8s: $(STAMP)
	$(BIN)/raybatch render k8s --config deployments/configs/demo.yaml -o k8s/demo
	$(BIN)/raybatch render k8s --config deployments/configs/gpu.yaml -o k8s/gpu

bench: $(STAMP)
	$(BIN)/python -m benchmarks.embedded_vs_seed

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
