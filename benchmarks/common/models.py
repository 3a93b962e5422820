"""The benchmark models, and each model's own ceiling.

Two models bracket what a batching host meets:

- `Sleep` (deployments.models) costs 2 ms per batch + 0.05 ms per item and no CPU, so the host
  has the cores to itself and any shortfall from the ceiling is the host's.
- `MLP` (deployments.models, 256→1024→256, one thread) is real CPU work competing with the
  host for the same two cores; its ceiling depends on the batch size.

`MatChain` (here) is a third, for scale-out: heavy, deterministic CPU work whose cost per
item hardly depends on the batch size, so that its replicas, not the path to them, are
the bottleneck (benchmarks.cluster.scale_out).

The ceiling is the model alone, in this process, on full batches back to back
(preprocess + transform + postprocess, no IPC, no queueing): the best any host
could do with one replica. Both models are module-level classes so a spawned
worker process can import them by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from batching import VectorTransformer
from batching.model import as_batch
from deployments.models import MLP, Sleep

SLEEP_DIM = 8
MLP_DIM = 256

def sleep_payloads(n: int = 16) -> list[np.ndarray]:
    return [np.full(SLEEP_DIM, i, dtype=np.float32) for i in range(n)]


def mlp_payloads(n: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return list(rng.standard_normal((n, MLP_DIM), dtype=np.float32))


class MatChain(VectorTransformer):
    """FP32 [-1, dim] → FP32 [-1, dim]: `steps` steps of X ← relu(X·W + B) per item, where
    B = v[:, None] · U is a dim×dim matrix made from the item's vector v, and the answer is
    X's row means. W (seeded) is contractive, so the answer is a fixed point that rounding
    does not move (batch sizes may round differently); a whole batch is one GEMM per step,
    so an item costs steps · 2·dim³ flops whatever its batch (~0.06 ms a step at dim 128 on
    one core of this machine). Wants one BLAS thread (OPENBLAS_NUM_THREADS=1).

    >>> m = MatChain(dim=4, steps=3); m.setup("cpu"); m([np.ones(4, np.float32)])[0].shape
    (4,)
    """

    def __init__(self, dim: int = 128, steps: int = 100, seed: int = 0) -> None:
        self.dim, self.steps, self.seed = dim, steps, seed
        self.w = self.u = np.zeros((0, 0), np.float32)

    def setup(self, device: str) -> None:
        super().setup(device)
        rng = np.random.default_rng(self.seed)
        # spectral norm of W about 0.5 (a Gaussian dim×dim matrix's is ~2·sqrt(dim))
        self.w = (rng.standard_normal((self.dim, self.dim)) * (0.25 / self.dim ** 0.5)
                  ).astype(np.float32)
        self.u = rng.standard_normal((self.dim, self.dim)).astype(np.float32)

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.ascontiguousarray(as_batch(items), dtype=np.float32).reshape(-1, self.dim)

    def transform(self, v: np.ndarray) -> np.ndarray:
        n, d = len(v), self.dim
        b = (v[:, :, None] * self.u).reshape(n * d, d)  # the batch's matrices, stacked
        x, y = b.copy(), np.empty_like(b)
        for _ in range(self.steps):
            np.matmul(x, self.w, out=y)
            y += b
            np.maximum(y, 0.0, out=y)
            x, y = y, x
        return x.reshape(n, d, d).mean(axis=2)


def matchain_payloads(n: int = 16, dim: int = 128) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return list(rng.standard_normal((n, dim), dtype=np.float32))


MODELS: dict[str, tuple[type[VectorTransformer], Callable[[int], list[np.ndarray]]]] = {
    "sleep": (Sleep, sleep_payloads),
    "mlp": (MLP, mlp_payloads),
    "matchain": (MatChain, matchain_payloads),
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
