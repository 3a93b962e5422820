"""Triton's example models, written as Raybatch models: what `triton-examples.yaml` serves
so Triton's own example client programs run against Raybatch unchanged.

- `Simple` (`simple`): INPUT0, INPUT1 INT32 [-1, 16] → OUTPUT0 = INPUT0 + INPUT1,
  OUTPUT1 = INPUT0 - INPUT1.
- `SimpleString` (`simple_string`): the same on BYTES tensors whose elements are decimal
  integers as strings ("3"), answered as decimal strings.
- `Identity` (`simple_identity`): a BYTES tensor back as it came, byte for byte.
- `SimpleSequence` (`simple_sequence`): stateful; INPUT INT32 [-1, 1] → OUTPUT INT32
  [-1, 1]: the input plus one on a sequence's first request, the input otherwise,
  which is what Triton's `simple_sequence` example clients check (their expected
  values: `1 if i == 0 else values[i - 1]`). The state is the sequence's step count.
The semantics are those the example programs check, read from their source
(tests/e2e/triton_examples/); no Triton model file is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batching import SequenceBatchInput, StatefulTransformer, VectorTransformer


class Simple(VectorTransformer):
    """{"INPUT0", "INPUT1": INT32 [B, 16]} → {"OUTPUT0": sum, "OUTPUT1": difference}.

    >>> out = Simple().transform({"INPUT0": np.array([[5]], np.int32),
    ...                           "INPUT1": np.array([[2]], np.int32)})
    >>> out["OUTPUT0"].tolist(), out["OUTPUT1"].tolist()
    ([[7]], [[3]])
    """

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        a, b = batch["INPUT0"], batch["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


def _ints(strings: np.ndarray, name: str) -> np.ndarray:
    try:
        return np.array([int(s) for s in strings.ravel()], np.int64).reshape(strings.shape)
    except ValueError:
        raise ValueError(f"{name} holds a string that is not a decimal integer; "
                         "simple_string takes integers as strings, like b'42'") from None


def _strings(ints: np.ndarray) -> np.ndarray:
    out = np.empty(ints.size, dtype=object)
    out[:] = [str(i).encode() for i in ints.ravel()]
    return out.reshape(ints.shape)


class SimpleString(VectorTransformer):
    """`Simple` on BYTES: decimal strings in, decimal strings out.

    >>> out = SimpleString().transform({"INPUT0": np.array([[b"5"]], object),
    ...                                 "INPUT1": np.array([[b"2"]], object)})
    >>> out["OUTPUT0"].tolist(), out["OUTPUT1"].tolist()
    ([[b'7']], [[b'3']])
    """

    def transform(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        a, b = _ints(batch["INPUT0"], "INPUT0"), _ints(batch["INPUT1"], "INPUT1")
        return {"OUTPUT0": _strings(a + b), "OUTPUT1": _strings(a - b)}


class Identity(VectorTransformer):
    """A BYTES batch back unchanged (embedded NUL bytes and non-UTF-8 bytes included)."""

    def transform(self, xs: Any) -> np.ndarray:
        return np.asarray(xs, dtype=object)


class SimpleSequence(StatefulTransformer):
    """INPUT INT32 [1] → OUTPUT INT32 [1] per row: input + 1 on a sequence's first
    request, the input after it; the state counts the sequence's requests.

    >>> from batching import StateStore
    >>> store = StateStore(SimpleSequence())
    >>> store.run(SequenceBatchInput(np.array([[0]], np.int32), (7,), (True,), (False,), (True,)))
    [array([1], dtype=int32)]
    >>> store.run(SequenceBatchInput(np.array([[11]], np.int32), (7,), (False,), (False,), (True,)))
    [array([11], dtype=int32)]
    """

    def initial_state(self) -> int:
        return 0  # requests seen so far

    def transform(self, inputs: np.ndarray, states: list[Any],
                  controls: SequenceBatchInput) -> tuple[Sequence[Any], list[Any]]:
        # inputs: one row per batch row, [rows, 1]; a row that is not ready holds zeros and
        # has state None: compute it anyway, its output and state are dropped.
        seen = np.array([0 if s is None else s for s in states], np.int32)
        out = np.asarray(inputs, np.int32).reshape(controls.rows, 1) + (seen == 0)[:, None]
        return out.astype(np.int32), [int(n) + 1 for n in seen]
