"""Stateful demo models for sequence batching, used by the demo, the tests and the benchmarks.

- `Accumulator`: Triton's `simple_sequence`: INT32 [1] in, INT32 [1] out = the running
  sum of the sequence's inputs, this one included; a start resets it to the input.
  State: an int.
- `GRU`: a torch GRU cell (8 inputs, 32 hidden units) and a linear read-out to 8
  outputs, weights from a fixed seed built in code, so two replicas compute the same
  function. State: the hidden vector (a float32 np.ndarray of 32).
Both compute every row of a batch in one vectorized call, and a row's result
depends only on its own input and state, so a sequence gets the same outputs
batched with others as alone. Rows that are not ready are computed on zeros and
ignored (the `StateStore` never commits them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batching import SequenceBatchInput, StatefulTransformer
from deployments.models.simple import set_torch_threads


def _rows(inputs: Any, controls: SequenceBatchInput, width: int, dtype: Any) -> np.ndarray:
    """The batch's inputs as a (rows, width) array; rows that are not ready are zeros."""
    if isinstance(inputs, np.ndarray):
        return np.ascontiguousarray(inputs, dtype=dtype).reshape(controls.rows, width)
    zeros = np.zeros(width, dtype=dtype)
    return np.stack([np.asarray(x, dtype=dtype).reshape(width) if ready else zeros
                     for x, ready in zip(inputs, controls.ready)])


class Accumulator(StatefulTransformer):
    """INPUT INT32 [1] → OUTPUT INT32 [1]: the sum of the sequence's inputs so far.

    >>> from batching import StateStore
    >>> store = StateStore(Accumulator())
    >>> store.run(SequenceBatchInput(np.array([[5]], np.int32), (7,), (True,), (False,), (True,)))
    [array([5], dtype=int32)]
    >>> store.run(SequenceBatchInput(np.array([[2]], np.int32), (7,), (False,), (True,), (True,)))
    [array([7], dtype=int32)]
    """

    def initial_state(self) -> int:
        return 0

    def transform(self, inputs: Any, states: list[Any],
                  controls: SequenceBatchInput) -> tuple[Sequence[Any], list[Any]]:
        x = _rows(inputs, controls, 1, np.int64)[:, 0]
        prev = np.array([0 if s is None else s for s in states], dtype=np.int64)
        total = (prev + x).astype(np.int32)  # wraps like Triton's INT32 accumulator
        return total.reshape(-1, 1), [int(t) for t in total]


class GRU(StatefulTransformer):
    """INPUT FP32 [8] → OUTPUT FP32 [8]: one GRU step, h' = GRUCell(x, h), y = W·h' + b."""

    input_dim = 8
    hidden_dim = 32

    def __init__(self, seed: int = 0, threads: int | None = 1) -> None:
        self.seed = seed
        self.threads = threads
        self.cell: Any = None
        self.proj: Any = None

    def setup(self, device: str) -> None:
        import torch

        super().setup(device)
        if self.threads:
            set_torch_threads(self.threads)
        torch.manual_seed(self.seed)
        self.cell = torch.nn.GRUCell(self.input_dim, self.hidden_dim).eval().to(device)
        self.proj = torch.nn.Linear(self.hidden_dim, self.input_dim).eval().to(device)

    def initial_state(self) -> np.ndarray:
        return np.zeros(self.hidden_dim, dtype=np.float32)

    def transform(self, inputs: Any, states: list[Any],
                  controls: SequenceBatchInput) -> tuple[Sequence[Any], list[Any]]:
        import torch

        x = _rows(inputs, controls, self.input_dim, np.float32)
        zeros = self.initial_state()
        h = np.stack([zeros if s is None else np.asarray(s, dtype=np.float32) for s in states])
        with torch.inference_mode():
            h_new = self.cell(torch.from_numpy(x).to(self.device),
                              torch.from_numpy(h).to(self.device))
            y = self.proj(h_new)
        h_np = h_new.cpu().numpy()
        return y.cpu().numpy(), [row.copy() for row in h_np]
