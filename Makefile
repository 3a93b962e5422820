# Two commands for a fresh machine: `make serve` (set up, then run) and `make test`.
# Setup is one venv with pinned dependencies; torch is the CPU wheel 2.13.0.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
JUPYTER_STAMP := $(VENV)/.jupyter-stamp

.PHONY: setup sysdeps serve test test-busy test-sanitized lint bench soak gpu-check clean k8s \
        notebooks notebooks-clean docs

# Debian packages whose command (same name) some tests need: prometheus answers the
# Grafana dashboard's queries in tests/integration/test_prometheus.py; wrk drives the HTTP
# benchmarks (tests/unit/benchmarks/test_wrk.py runs it for real). Installed when
# running as root with apt-get (CI); elsewhere those tests skip and say how to install.
SYSDEPS := prometheus wrk

# An existing venv is kept (`python -m venv` again would only reinstall pip, 3 s); the
# installs run again whenever a file named here changes.
$(STAMP): pyproject.toml setup.py constraints.txt deployments/protocol/_jsonfast.c deployments/http/native/_front.c deployments/http/native/llhttp/llhttp.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# Everything, torch included, in one uv call when uv can be had (parallel downloads and
	@# unpacking: half pip's time), reading pip's find-links (where this
	@# machine keeps torch's CPU wheel: $$PIP_FIND_LINKS, else pip's config), as pip would;
	@# else pip, torch first. Then what the running product imports is compiled to bytecode
	@# (raybatch.bytecode: the runtime's distributions and the project's packages, not the
	@# extras): where PYTHONDONTWRITEBYTECODE is set, a process would otherwise parse every
	@# module it imports (a Ray worker starts in twice the time)
	if $(BIN)/python -m pip install -q uv==0.13.9; then \
	  links=""; for l in $${PIP_FIND_LINKS:-$$($(BIN)/python -m pip config get global.find-links \
	    2>/dev/null)}; do links="$$links --find-links $$l"; done; \
	  $(BIN)/uv pip install -q --python $(BIN)/python $$links \
	    -c constraints.txt -e ".[dev,embeddings,notebooks,docs]"; \
	else $(BIN)/python -m pip install -q --upgrade pip && \
	  $(BIN)/python -m pip install -q torch==2.13.0 && \
	  $(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,embeddings,notebooks,docs]"; fi
	$(BIN)/python -m raybatch.bytecode
	$(BIN)/python -m deployments.models.weightcache
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

# tests/run.sh: two lanes on two cores, the tests that share the session's Ray then the
# notebooks (each that needs Ray starts its own), beside the unit tests then the tests that
# start a Ray of their own. Under CI (`CI` set) the notebooks run at a small scale;
# RAYBATCH_NOTEBOOK_SCALE=small|full decides. sysdeps (apt) and the venv (pip) install
# side by side (two jobs), each target's output kept together.
test:
	@$(MAKE) --no-print-directory --jobs=2 --output-sync=target sysdeps lint
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	PY=$(BIN)/python bash tests/run.sh

# The suite as `make test` runs it (tests/run.sh), with a CPU hog pinned to one core
# (HOG_CPU, default 0) for as long as it runs: CI's busy shared 2-core machine, on purpose.
# A test that passes alone and fails here asserts how fast the machine is, not what the
# code does. The hog is killed when the suite ends, fails or is interrupted. Lints first,
# as `make test` does, so a run that passes here is not failed by CI's linter.
HOG_CPU ?= 0
test-busy: lint
	@pin=""; command -v taskset >/dev/null && pin="taskset -c $(HOG_CPU)"; \
	$$pin $(PYTHON) -c 'while True: pass' & hog=$$!; \
	trap 'kill $$hog 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "test-busy: a CPU hog (pid $$hog) on core $(HOG_CPU) while the suite runs"; \
	PY=$(BIN)/python bash tests/run.sh

# The native front's tests with the front built with AddressSanitizer and UBSan (the
# suite runs them this way; this runs them alone).
test-sanitized: $(STAMP)
	PY=$(BIN)/python bash tests/sanitize.sh

# The documentation site (docs/, mkdocs.yml), served with live reload on 127.0.0.1:8000.
docs: $(STAMP)
	$(BIN)/mkdocs serve

# JupyterLab on the notebooks (installs the `jupyter` extra on first use).
$(JUPYTER_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[jupyter]"
	touch $(JUPYTER_STAMP)

notebooks: $(JUPYTER_STAMP)
	$(BIN)/jupyter lab notebooks/

# Outputs stay out of git (a unit test fails on a committed output): strip before committing.
notebooks-clean: $(JUPYTER_STAMP)
	$(BIN)/jupyter nbconvert --clear-output --inplace --ClearMetadataPreprocessor.enabled=True \
	    --ClearMetadataPreprocessor.preserve_cell_metadata_mask=tags \
	    --ClearMetadataPreprocessor.preserve_nb_metadata_mask=kernelspec \
	    --ClearMetadataPreprocessor.preserve_nb_metadata_mask=language_info notebooks/*.ipynb

# The manifests checked in under k8s/, rendered from the configs they name (a test fails
# when they drift from what the renderer makes of those configs now).
k8s: $(STAMP)
	$(BIN)/raybatch render k8s --config deployments/configs/demo.yaml -o k8s/demo
	$(BIN)/raybatch render k8s --config deployments/configs/gpu.yaml -o k8s/gpu

# On a machine with one NVIDIA GPU: the GPU example deployed, checked against the CPU and
# loaded (benchmarks/serve/gpu_check.py); without one it says SKIP.
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.serve.gpu_check

# What measures runs here (and in `make soak`), on a quiet machine, not in `make test`.
# bench: the embedded host
# against the seed design, then the simulator against a real run (within 15%; notebook 02
# shows that comparison and no longer checks it).
bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine.embedded_vs_seed
	$(BIN)/python -m benchmarks.engine.sim_vs_real --quick

# soak: tests/integration/test_load.py at full size (a soak of 100,000 requests with random
# cancels, and 30 s of overload at 10x a model's capacity; `make test` runs the same
# checks at 2,000 and 6 s), the tests marked `soak` (pytest leaves them out otherwise), then
# how fast overload, recovery, a burst and stopping are, against their targets
# (benchmarks.serve.reliability_times). Figures are printed (-s).
SOAK_TIMEOUT ?= 1800
soak: $(STAMP)
	RAYBATCH_SOAK_REQUESTS=$${RAYBATCH_SOAK_REQUESTS:-100000} \
	  RAYBATCH_OVERLOAD_S=$${RAYBATCH_OVERLOAD_S:-30} \
	  $(BIN)/python -m pytest -q -s -p no:cacheprovider --timeout $(SOAK_TIMEOUT) \
	  tests/integration/test_load.py
	$(BIN)/python -m pytest -q -s -p no:cacheprovider --timeout $(SOAK_TIMEOUT) -m soak \
	  || [ $$? = 5 ]
	for what in overload recovery burst stop; do \
	  $(BIN)/python -m benchmarks.serve.reliability_times $$what || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site build
	find deployments -name '*.so' -delete
