# Two commands for a fresh machine: `make serve` (set up, then run) and `make test`.
# Setup is one venv with pinned dependencies; torch is the CPU wheel 2.13.0.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup serve test lint bench clean

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

bench: $(STAMP)
	$(BIN)/python -m benchmarks.embedded_vs_seed

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
