"""Warm-up: the batches a replica runs before it reports ready (Triton's model_warmup).

The first batches of a fresh model pay for lazy initialization (allocator pools,
kernel selection, tokenizer caches); without a warm-up the first users pay it.
A replica of a dynamic or a stateful (sequence) model runs `warmup.count` batches
of each configured size (default: 1, then the policy's preferred sizes), built from
the declared inputs (zeros, b"0" for BYTES: a string that numeric and text models
alike take; -1 dims of `warmup.dims` or 1) or from `warmup.data`, joined exactly as
the engine joins a real batch. A stateful model gets each batch as rows of as many
one-request sequences (start, end and ready set on every row) through a throwaway
`StateStore`, so no state outlives the warm-up. The first answer of each size is
checked against the declared outputs (names, rows, shapes, datatypes), so a class
that does not fit its config fails here, at deploy time, with a message that says
what differs and how to fix it. Generative models have no warm-up (yet). Each batch's
time is reported (`warmup_batches`): the engine's first admission predictions come from
them (`BatchHost.seed_latency`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from batching.errors import ModelError
from batching.model import run_batch
from batching.sequence.stateful import SequenceBatchInput, StateStore
from batching.tensors import TensorBatch
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
    stateful = config.batching.kind == "sequence"
    t0 = time.perf_counter()
    timed: list[tuple[int, float]] = []  # (size, seconds) of each batch
    for size in sizes:
        batch = signature.warmup_batch(size, w) if stateful else collate(
            [signature.warmup_batch(size, w)])
        for run in range(w.count):
            try:
                start = time.perf_counter()
                out = _run_sequences(model, batch, size) if stateful else run_batch(model, batch)
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


def _run_sequences(model: Any, batch: Any, size: int) -> Any:
    """A stateful model's answer to `size` rows, each the only request of a sequence of
    its own, as one batch (a TensorBatch for named outputs) for `check_answer`."""
    items = [batch[i] for i in range(size)] if isinstance(batch, TensorBatch) else batch
    flags = (True,) * size
    ids = tuple(f"warm-up-{i}" for i in range(size))
    rows = StateStore(model).run(SequenceBatchInput(items, ids, flags, flags, flags))
    try:
        if rows and isinstance(rows[0], dict):
            return TensorBatch({n: np.stack([np.asarray(r[n]) for r in rows]) for n in rows[0]})
        return np.stack([np.asarray(r) for r in rows])
    except (KeyError, ValueError) as e:
        raise ModelError(f"its rows' outputs do not stack into one batch ({e}): return "
                         "one output per row, each of the declared output's item shape "
                         "(or a dict of them, by output name)") from None
