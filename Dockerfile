# Raybatch on Ray 2.60, CPU: the image the manifests in k8s/ run by default.
#   docker build -t raybatch:0.1.0 .
# The base image's `ray` user (uid 1000, gid 100) owns the Python environment and runs
# everything; the package is installed (not editable) with its runtime extras, at the
# versions pinned in constraints.txt. Dockerfile.gpu is the same on Ray's CUDA image.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu
FROM ${RAY_IMAGE}

USER 1000
WORKDIR /home/ray/raybatch

# torch's CPU build, the version pyproject pins (PyPI's default one carries CUDA: GBs).
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY --chown=1000:100 pyproject.toml setup.py constraints.txt README.md ./
COPY --chown=1000:100 batching ./batching
COPY --chown=1000:100 cluster ./cluster
COPY --chown=1000:100 deployments ./deployments
COPY --chown=1000:100 raybatch ./raybatch
COPY --chown=1000:100 benchmarks ./benchmarks
RUN pip install --no-cache-dir -c constraints.txt ".[embeddings]" \
    && raybatch --help > /dev/null
# The demo's trained weights (TinyLM), computed once here instead of at every pod start.
RUN python -m deployments.models.weightcache

USER 1000
