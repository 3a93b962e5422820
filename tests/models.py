"""Test-only transformers, imported by model replicas as `tests.models:Name`.

- `SlowSquare`: y = x² after a short sleep per batch, so batches are still in
  flight when a test kills a replica (an injective function of distinct inputs:
  an answer sent to the wrong request cannot go unnoticed).
- `Gated`: y = x + 1, but a batch waits while the gate file exists, so a test
  decides when the replica is busy (queue-full and deadline tests) without
  guessing how long to sleep.
- `TokenStats`: ragged token ids (padded with -1 by the batcher) and a weight per
  item in; each item's own length, weighted sum and the batch's padded length out,
  so a test sees both that padding happened and that it never leaked into a result.
- `HangOnNegative`: y = x + 1, but a batch with a negative item never ends: a hung
  model (the batch timeout tests).
- `FailNegative`: y = x + 1, but a negative item fails alone (`ItemFailed`): only
  the requests that carry one fail, their batch-mates get their answers.
- `ReadWhileRunning` (items: `Marked`, which note when the replica unpickles them):
  each batch's answer says whether its items were read while the batch before it ran,
  and which thread ran it: a test sees a replica actor read ahead, the model on one
  thread.
- `GpuStandIn`: what a GPU model class does on a machine without one: it is handed its
  device (`cuda` when Ray gave its replica a GPU) and records it, never touching CUDA;
  each item's output is `width` copies of its length (a number for FP32 items, the
  byte count for BYTES), so `gpu.yaml`'s models can be deployed with it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.ledger import ItemFailed
from batching.model import VectorTransformer


class SlowSquare(VectorTransformer):
    """FP32 [-1] → x², sleeping `delay_ms` per batch."""

    def __init__(self, delay_ms: float = 5.0) -> None:
        self.delay_s = delay_ms / 1e3

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        time.sleep(self.delay_s)
        return xs * xs


class Gated(VectorTransformer):
    """FP32 [-1] → x + 1, once the file `gate_path` no longer exists (at most `max_wait_s`)."""

    def __init__(self, gate_path: str, max_wait_s: float = 60.0) -> None:
        self.gate_path = gate_path
        self.max_wait_s = max_wait_s

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        give_up = time.monotonic() + self.max_wait_s
        while os.path.exists(self.gate_path) and time.monotonic() < give_up:
            time.sleep(0.005)
        return xs + 1


class TokenStats(VectorTransformer):
    """{"ids": INT64 [B, L] padded with -1, "weight": FP32 [B]} →
    {"length": INT64 [B], "total": FP32 [B], "padded_to": INT64 [B]}."""

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, weight = batch["ids"], batch["weight"]
        real = ids != -1
        return {"length": real.sum(axis=1),
                "total": np.where(real, ids, 0).sum(axis=1).astype(np.float32) * weight,
                "padded_to": np.full(len(ids), ids.shape[1], dtype=np.int64)}


class HangOnNegative(VectorTransformer):
    """FP32 [-1] → x + 1; a batch holding a negative item hangs (until the process dies,
    or for `hang_s`: an in-process replica's thread cannot be killed, so its tests bound it)."""

    def __init__(self, hang_s: float | None = None) -> None:
        self.hang_s = hang_s

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        give_up = time.monotonic() + (self.hang_s if self.hang_s is not None else float("inf"))
        while (xs < 0).any() and time.monotonic() < give_up:
            time.sleep(0.01)
        return xs + 1


class FailNegative(VectorTransformer):
    """FP32 [-1] → x + 1 per item; a negative item fails alone with ValueError."""

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> list[Any]:
        return [ItemFailed(ValueError(f"negative input {x}: this model takes x >= 0"))
                if x < 0 else np.float32(x + 1) for x in xs]



READ_AT: dict[float, float] = {}  # Marked.value -> when this process unpickled it


class Marked:
    """An item that notes (in READ_AT) when the replica's process unpickled it."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __getstate__(self) -> float:
        return self.value

    def __setstate__(self, value: float) -> None:
        self.value = value
        READ_AT[value] = time.monotonic()


class ReadWhileRunning(VectorTransformer):
    """`Marked` items → per item [1 if the batch's items were unpickled while the previous
    batch ran else 0, the number of the thread that ran the model (0 = the first seen)],
    after `delay_ms`."""

    def __init__(self, delay_ms: float = 300.0) -> None:
        self.delay_s = delay_ms / 1e3
        self.threads: dict[int, int] = {}
        self.last: tuple[float, float] = (0.0, 0.0)  # the previous batch's run

    def preprocess(self, items: Sequence[Any]) -> list[float]:
        return [item.value for item in items]

    def transform(self, values: list[float]) -> np.ndarray:
        started = time.monotonic()
        first, last = self.last
        ahead = all(first <= READ_AT.get(v, -1.0) < last for v in values)
        tag = self.threads.setdefault(threading.get_ident(), len(self.threads))
        time.sleep(self.delay_s)
        self.last = (started, time.monotonic())
        return np.array([[float(ahead), float(tag)]] * len(values), dtype=np.float32)


class GpuStandIn(VectorTransformer):
    """Any [-1, ...] or BYTES [-1] → FP32 [-1, width]: each row the item's size."""

    def __init__(self, width: int = 256) -> None:
        self.width = width
        self.device = ""

    def setup(self, device: str) -> None:
        self.device = device  # "cuda" with a GPU from Ray: recorded, never used

    def transform(self, items: Sequence[Any]) -> np.ndarray:
        sizes = [len(x) if isinstance(x, (bytes, str)) else np.size(x) for x in items]
        return np.repeat(np.asarray(sizes, np.float32)[:, None], self.width, axis=1)
