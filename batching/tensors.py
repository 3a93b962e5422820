"""Multi-tensor batches and ragged items: what a batch's pieces become for the model.

A model with several named inputs (or outputs) carries its items as a `TensorBatch`:
one array per name, all with the same leading (batch) dimension. It offers what the
engine needs of any items (`len` in items, a slice [start, stop) of every tensor at
once, `concatenate`), so a request is still split across batches by cost and joined
again per name by the ledger, which matches rows to requests by item offsets.

`Collate` decides how the pieces of one batch (one per request part) become the
model's input: one contiguous array or `TensorBatch`, as before; a ragged tensor
padded to the longest piece along its declared axis with its pad value; or, for a
tensor declared as a list, a list of per-item arrays, unpadded. Pieces whose shapes
disagree on a tensor that declares neither fail their batch with a message saying
what to declare. Pure numpy; never imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from batching.errors import BatchSizeMismatch, InvalidRequest


@dataclass(frozen=True, slots=True)
class TensorBatch:
    """Named arrays sharing their leading (batch) dimension; `len` counts items.

    >>> tb = TensorBatch({"a": np.arange(4), "b": np.zeros((4, 2))})
    >>> len(tb), tb[1:3]["a"].tolist(), tb.names
    (4, [1, 2], ('a', 'b'))
    """

    tensors: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        if not self.tensors:
            raise ValueError("a TensorBatch needs at least one tensor")
        sizes = {name: _rows(a) for name, a in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise BatchSizeMismatch(
                f"tensors disagree on the batch size (leading dim): {sizes}; every tensor "
                "of a batch must carry one row per item")

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> TensorBatch:
        """A TensorBatch from a model's outputs (arrays or array-likes)."""
        return cls({name: v if isinstance(v, np.ndarray) else np.asarray(v)
                    for name, v in mapping.items()})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tensors)

    def __len__(self) -> int:
        return _rows(next(iter(self.tensors.values())))

    def __getitem__(self, key: Any) -> Any:
        """A tensor by name, a TensorBatch by slice, one item's rows (a dict) by index."""
        if isinstance(key, str):
            return self.tensors[key]
        if isinstance(key, slice):
            return TensorBatch({n: a[key] for n, a in self.tensors.items()})
        return {n: a[key] for n, a in self.tensors.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Items, one dict of rows each (what a policy's cost_fn is handed)."""
        return (self[i] for i in range(len(self)))

    def as_dict(self) -> dict[str, np.ndarray]:
        return dict(self.tensors)

    @staticmethod
    def concatenate(batches: Sequence[TensorBatch]) -> TensorBatch:
        """The batches' items in order, per name (every batch must have the same names)."""
        first = batches[0]
        if len(batches) == 1:
            return first
        names = first.names
        for b in batches[1:]:
            if b.names != names:
                raise BatchSizeMismatch(f"cannot join tensors {list(b.names)} to "
                                        f"{list(names)}: every piece needs the same names")
        return TensorBatch({n: _concat([b.tensors[n] for b in batches], n) for n in names})


def _rows(array: np.ndarray) -> int:
    if array.ndim == 0:
        raise BatchSizeMismatch("a tensor of a batch is a scalar: it needs a leading batch dim")
    return array.shape[0]


@dataclass(frozen=True, slots=True)
class Ragged:
    """How one tensor's items of different lengths share a batch.

    `pad`: padded to the longest piece along `axis` (of the full tensor; 0 is the batch
    dim) with `pad_value`. `list`: handed to the model as a list of per-item arrays.
    """

    mode: Literal["pad", "list"] = "pad"
    axis: int = 1
    pad_value: Any = 0


class Collate:
    """Joins a batch's pieces into the model's input.

    `ragged` maps tensor names to their `Ragged` rule; `name` is the tensor a
    single-tensor model's pieces (plain arrays) belong to.

    >>> c = Collate({"x": Ragged(axis=1, pad_value=-1)}, name="x")
    >>> c([np.ones((1, 2), int), np.ones((1, 3), int)]).tolist()
    [[1, 1, -1], [1, 1, 1]]
    """

    def __init__(self, ragged: Mapping[str, Ragged] | None = None, name: str | None = None
                 ) -> None:
        self.ragged = dict(ragged or {})
        self.name = name

    def __call__(self, pieces: list[Any]) -> Any:
        if all(isinstance(p, TensorBatch) for p in pieces):
            return self._tensors(pieces)
        if all(isinstance(p, np.ndarray) for p in pieces):
            return self._join(pieces, self.name)
        return join_items(pieces)

    def _tensors(self, pieces: list[TensorBatch]) -> Any:
        names = pieces[0].names
        joined = {n: self._join([p.tensors[n] for p in pieces], n) for n in names}
        if any(isinstance(v, list) for v in joined.values()):
            return joined  # a list-mode tensor: the model gets a plain dict
        return TensorBatch(joined)

    def _join(self, arrays: list[np.ndarray], name: str | None) -> Any:
        rule = self.ragged.get(name) if name is not None else None
        if rule is None:
            return arrays[0] if len(arrays) == 1 else _concat(arrays, name)
        if rule.mode == "list":
            return [row for a in arrays for row in a]
        return pad_concat(arrays, rule.axis, rule.pad_value)


def pad_concat(arrays: list[np.ndarray], axis: int, pad_value: Any) -> np.ndarray:
    """Arrays padded to the longest along `axis` with `pad_value`, then concatenated."""
    longest = max(a.shape[axis] for a in arrays)
    if all(a.shape[axis] == longest for a in arrays):
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    shape = list(arrays[0].shape)
    shape[0] = sum(a.shape[0] for a in arrays)
    shape[axis] = longest
    out = np.full(shape, pad_value, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        index = [slice(row, row + a.shape[0])] + [slice(None)] * (a.ndim - 1)
        index[axis] = slice(0, a.shape[axis])
        out[tuple(index)] = a
        row += a.shape[0]
    return out


def _concat(arrays: list[np.ndarray], name: str | None) -> np.ndarray:
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) > 1:
        what = f"tensor {name!r}" if name else "the tensor"
        raise InvalidRequest(
            f"{what} has items of shapes {sorted(shapes)} in one batch, which cannot be "
            "stacked; declare it ragged in the model config (ragged: {mode: pad, axis: N, "
            "pad_value: V} or {mode: list}), or send items of one shape")
    return np.concatenate(arrays)


def join_items(pieces: list[Any]) -> Any:
    """The default join: one array when the pieces are arrays of one shape, else a list."""
    if len(pieces) == 1 and isinstance(pieces[0], (np.ndarray, TensorBatch)):
        return pieces[0]
    if all(isinstance(x, np.ndarray) for x in pieces):
        return _concat(pieces, None)
    if all(isinstance(x, TensorBatch) for x in pieces):
        return TensorBatch.concatenate(pieces)
    flat = [x for piece in pieces for x in piece]
    if flat and isinstance(flat[0], np.ndarray) and _same_shape(flat):
        return np.stack(flat)
    return flat


def _same_shape(arrays: list) -> bool:
    first = arrays[0]
    return all(isinstance(a, np.ndarray) and a.shape == first.shape and a.dtype == first.dtype
               for a in arrays)


def length_of(name: str | None = None, axis: int = 1) -> Callable[[Any], float]:
    """A request's item length, for grouping by length: the size of tensor `name` (or the
    one tensor) along `axis`; for strings and bytes, the longest element's length.

    >>> length_of()(np.array([b"ab", b"abcd"], dtype=object))
    4
    """

    def length(items: Any) -> float:
        array = items[name] if isinstance(items, TensorBatch) and name else items
        if isinstance(array, TensorBatch):
            array = next(iter(array.tensors.values()))
        if isinstance(array, np.ndarray) and array.dtype.kind not in "OSU":
            return array.shape[axis] if array.ndim > axis else 1
        return max((len(x) for x in np.asarray(array, dtype=object).ravel()), default=0)

    return length
