"""The benchmark models, and each model's own ceiling.

Two models bracket what a batching host meets:

- `Sleep` (deployments.models) costs 2 ms per batch + 0.05 ms per item and no CPU, so the host
  has the cores to itself and any shortfall from the ceiling is the host's.
- `MLP` (deployments.models, 256→1024→256, one thread) is real CPU work competing with the
  host for the same two cores; its ceiling depends on the batch size.

The ceiling is the model alone, in this process, on full batches back to back
(preprocess + transform + postprocess, no IPC, no queueing): the best any host
could do with one replica. Both models are module-level classes so a spawned
worker process can import them by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from batching import VectorTransformer
from deployments.models import MLP, Sleep

SLEEP_DIM = 8
MLP_DIM = 256

def sleep_payloads(n: int = 16) -> list[np.ndarray]:
    return [np.full(SLEEP_DIM, i, dtype=np.float32) for i in range(n)]


def mlp_payloads(n: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return list(rng.standard_normal((n, MLP_DIM), dtype=np.float32))


MODELS: dict[str, tuple[type[VectorTransformer], Callable[[int], list[np.ndarray]]]] = {
    "sleep": (Sleep, sleep_payloads),
    "mlp": (MLP, mlp_payloads),
}


def measure_ceiling(
    model_cls: type[VectorTransformer],
    payloads: list[Any],
    *,
    batch_size: int = 64,
    duration_s: float = 2.0,
) -> float:
    """Items/s of the model alone on full batches of `batch_size`, back to back, in-process."""
    model = model_cls()
    model.setup("cpu")
    items = [payloads[i % len(payloads)] for i in range(batch_size)]
    model(items)  # first call pays for lazy initialisation
    batches = 0
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    while True:
        out = model(items)
        batches += 1
        if time.perf_counter() >= deadline:
            break
    if len(out) != batch_size:
        raise AssertionError(f"{model_cls.__name__} returned {len(out)} results for {batch_size}")
    return batches * batch_size / (time.perf_counter() - t0)
