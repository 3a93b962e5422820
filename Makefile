# Two commands for a fresh machine: `make serve` (set up, then run) and `make test`.
# Setup is one venv with pinned dependencies; torch is the CPU wheel 2.13.0.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup serve test lint bench clean k8s

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,embeddings]"
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(BIN)/raybatch up

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
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
