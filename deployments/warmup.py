"""Warm-up: the batches a replica runs before it reports ready (Triton's model_warmup).

The first batches of a fresh model pay for lazy initialization (allocator pools,
kernel selection, tokenizer caches); without a warm-up the first users pay it.
A replica of a dynamic model runs `warmup.count` batches of each configured size
(default: 1, then the policy's preferred sizes), built from the declared inputs
(zeros, "warm-up" for BYTES, -1 dims of `warmup.dims` or 1) or from `warmup.data`,
joined exactly as the engine joins a real batch. The first answer of each size is
checked against the declared outputs (names, rows, shapes, datatypes), so a class
that does not fit its config fails here, at deploy time, with a message that says
what differs and how to fix it. Each batch's time is reported (`warmup_batches`): the
engine's first admission predictions come from them (`BatchHost.seed_latency`).
"""

from __future__ import annotations

import time
from typing import Any

from batching.errors import ModelError
from batching.model import run_batch
from cluster.config import ModelConfig
from deployments.signature import Signature


def warmup_sizes(config: ModelConfig) -> list[int]:
    """The batch sizes a replica warms up with, each at most max_batch_size."""
    w = config.warmup
    largest = getattr(config.batching, "max_batch_size", 1)
    sizes = w.batch_sizes or (1, *getattr(config.batching, "preferred_batch_sizes", ()))
    return list(dict.fromkeys(min(s, largest) for s in sizes))  # in order, each once


def warm_up(config: ModelConfig, model: Any) -> dict[str, Any]:
    """Run the warm-up batches on `model`; what ran and how long it took.
    Raises ModelError naming the model, the batch and the fix."""
    w = config.warmup
    if not w.enabled:
        return {"batch_sizes": [], "warmup_s": 0.0}
    signature = Signature(config)
    collate = signature.collate()
    sizes = warmup_sizes(config)
    t0 = time.perf_counter()
    timed: list[tuple[int, float]] = []  # (size, seconds) of each batch
    for size in sizes:
        batch = collate([signature.warmup_batch(size, w)])
        for run in range(w.count):
            try:
                start = time.perf_counter()
                out = run_batch(model, batch)
                timed.append((size, time.perf_counter() - start))
            except Exception as e:
                raise ModelError(
                    f"model {config.name!r} ({config.transformer}) raised on its warm-up batch "
                    f"of {size} synthesized items: {type(e).__name__}: {e}. Fix the model, "
                    "give warmup.data one valid item per input, or set warmup.enabled: false"
                ) from e
            if run == 0:
                try:
                    signature.check_answer(out, size)
                except ModelError as e:
                    raise ModelError(f"{config.transformer} does not match the tensors "
                                     f"declared for it: {e}") from None
    return {"batch_sizes": sizes, "warmup_s": round(time.perf_counter() - t0, 3),
            "warmup_batches": timed}
