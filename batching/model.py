"""The model interface: a vectorized transform with hooks around it.

A `VectorTransformer` sees whole batches: `preprocess(items)` turns the batch's
items into model input, `transform(pre)` runs the model once for all of them,
`postprocess(pre, out)` turns the output into one result per item. The host
calls `setup(device)` once, in the process that will run the model, before the
first batch, so heavy state (weights, CUDA contexts) is created there.

The number of results must equal the number of items: anything else fails the
batch with `BatchSizeMismatch`. To fail one item only, put `ItemFailed(error)`
in its place.

A model with several named inputs or outputs sees its batch as a dict of arrays
(`{"query": [B, 16], "doc": [B, 16]}`, every input stacked per name) and returns a
dict of arrays, one row per item in each; `run_batch` hands the model that dict
and turns its answer into a `TensorBatch` the ledger cuts per request.

A model's inputs are its own, writable (`writable`). A request's array is a read-only
view of the bytes it came in (the HTTP body, a frame of the direct connection: pickle
keeps an array read-only on the way), and a batch of one request is that array, while a
batch of several is a fresh concatenation: without the copy a model that writes to its
inputs (or `torch.from_numpy`, which warns on a read-only array) would work under load
and fail on a lone request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from batching.tensors import TensorBatch


class VectorTransformer:
    """Base class of batched models.

    >>> class Square(VectorTransformer):
    ...     def transform(self, xs):
    ...         return [x * x for x in xs]
    >>> Square()([1, 2, 3])
    [1, 4, 9]
    """

    device: str = "cpu"

    def setup(self, device: str) -> None:
        """Called once before the first batch, with "cpu" or "cuda:N"."""
        self.device = device

    def preprocess(self, items: Sequence[Any]) -> Any:
        return items

    def transform(self, pre: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement transform(pre)")

    def postprocess(self, pre: Any, out: Any) -> Sequence[Any]:
        return out

    def __call__(self, items: Sequence[Any]) -> Sequence[Any]:
        pre = self.preprocess(items)
        return self.postprocess(pre, self.transform(pre))


def as_batch(items: Sequence[Any]) -> Any:
    """Items as one array with a leading batch dimension when they are array-like.

    Several arrays (from requests of many items, or single items of one shape)
    become one contiguous array; other items stay a list.
    """
    if isinstance(items, np.ndarray):
        return items
    if items and all(isinstance(x, np.ndarray) for x in items):
        return np.stack(items)
    return list(items)


def _read_only(x: Any) -> bool:
    return isinstance(x, np.ndarray) and not x.flags.writeable


def writable(items: Any) -> Any:
    """`items` with each read-only array in it copied: the batch's array, a named input's,
    a row of a list (a named input's too). Writable arrays (a batch of several requests is
    one, freshly concatenated) and everything else are handed on as they are.

    >>> x = np.frombuffer(bytes(8), np.float32)
    >>> writable(x).flags.writeable, writable({"a": x})["a"].flags.writeable
    (True, True)
    """
    if isinstance(items, np.ndarray):
        return items.copy() if not items.flags.writeable else items
    if isinstance(items, dict):  # named inputs: arrays, or lists of rows (ragged "list")
        fixed = {k: writable(v) for k, v in items.items()}
        return items if all(fixed[k] is v for k, v in items.items()) else fixed
    if isinstance(items, list) and any(map(_read_only, items)):
        return [x.copy() if _read_only(x) else x for x in items]
    return items


def instantiate(target: Any, args: tuple, kwargs: dict) -> Any:
    """A transformer from a class or factory (called with args), or an instance as is."""
    if isinstance(target, type) or not hasattr(target, "transform"):
        return target(*args, **kwargs)
    return target


def run_batch(model: Any, items: Any) -> Sequence[Any]:
    """preprocess → transform → postprocess, with results as a sized sequence
    (a `TensorBatch` when the model returns named outputs)."""
    if isinstance(items, TensorBatch):
        items = items.as_dict()
    pre = model.preprocess(writable(items))
    out = model.postprocess(pre, model.transform(pre))
    if isinstance(out, Mapping):
        return TensorBatch.of(out)
    if not isinstance(out, (list, tuple, np.ndarray)):
        out = list(out)
    return out
