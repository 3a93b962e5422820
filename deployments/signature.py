"""A model's declared tensors, and everything that follows from them.

One `Signature` per model, built from its config, answers every shape question in
one place: is a request's input what the model declares (the route, for HTTP,
gRPC, handle and client calls alike), what a request's result looks like as the
declared outputs (the route), how a batch's pieces are joined and how long an
item is (the engine's `Collate` and length function, from the ragged inputs),
which batches warm a replica up, and whether a model's answer to a batch matches
its declared outputs (the replica, before it reports ready).

A model with one input and one output sees arrays, as it always did; any other
sees a dict of arrays per batch (`batching.TensorBatch` on the way). Callers
never send pickles: an input must be a numpy array of exactly the declared dtype
(byte order aside); object arrays only for BYTES, holding bytes or str.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from batching.errors import InvalidRequest, ModelError
from batching.tensors import Collate, Ragged, TensorBatch, length_of
from cluster.config import ModelConfig, TensorConfig, WarmupConfig
from deployments.protocol.datatypes import NUMPY_DTYPES, datatype_of
from deployments.protocol.wording import unexpected_input, unexpected_shape, wrong_datatype


class Signature:
    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.inputs = {t.name: t for t in config.inputs}
        self.outputs = {t.name: t for t in config.outputs}
        self.multi = len(self.inputs) > 1 or len(self.outputs) > 1
        self._single_in = config.inputs[0]
        self.single_input = self._single_in.name
        self._single_out = config.outputs[0]

    # -- requests (the route) ----------------------------------------------------------
    def items(self, inputs: Mapping[str, Any]) -> np.ndarray | TensorBatch:
        """A request's items, checked against the declared inputs: one array for a
        single-input model, else a TensorBatch of every input."""
        if not isinstance(inputs, Mapping):
            raise InvalidRequest(f"inputs must be a dict of numpy arrays by input name, "
                                 f"got {type(inputs).__name__}")
        if set(inputs) != set(self.inputs):
            raise InvalidRequest(self._names_message(inputs))
        arrays = {name: self._array(inputs[name], self.inputs[name]) for name in self.inputs}
        sizes = {name: a.shape[0] for name, a in arrays.items()}
        if len(set(sizes.values())) > 1:
            raise InvalidRequest(f"the inputs of model {self.model!r} disagree on the batch "
                                 f"size (leading dim): {sizes}; every input of a request "
                                 "must carry the same number of items")
        if next(iter(sizes.values())) == 0:
            name = next(iter(arrays))
            raise InvalidRequest(f"input {name!r} has an empty batch dimension: send at "
                                 "least one item")
        if len(arrays) == 1:
            return next(iter(arrays.values()))
        return TensorBatch(arrays)

    def _names_message(self, inputs: Mapping[str, Any]) -> str:
        got = sorted(map(str, inputs))
        if len(self.inputs) == 1:
            extra = [n for n in got if n != self._single_in.name]
            if extra:
                return unexpected_input(extra[0], self.model, [self._single_in.name]) + (
                    f"; got {got}")
            return (f"model {self.model!r} takes exactly one input "
                    f"{self._single_in.name!r}; got {got}")
        missing = sorted(set(self.inputs) - set(inputs))
        extra = sorted(map(str, set(inputs) - set(self.inputs)))
        if extra:  # Triton's words for an input the model does not have
            return unexpected_input(extra[0], self.model, list(self.inputs)) + (
                f"; got {got}" + (f" (missing {missing})" if missing else ""))
        return (f"model {self.model!r} takes inputs {list(self.inputs)}; got {got}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unknown {extra})" if extra else ""))

    def _array(self, array: Any, tensor: TensorConfig) -> np.ndarray:
        where = f"input {tensor.name!r}"
        if not isinstance(array, np.ndarray):
            raise InvalidRequest(f"{where} must be a numpy array of {tensor.datatype}, got "
                                 f"{type(array).__name__}; wrap it in np.asarray(..., dtype)")
        array = _as_declared(array, tensor, self.model)
        shape = tensor.shape
        if array.ndim != len(shape) or any(
                want not in (-1, got) for got, want in zip(array.shape, shape)):
            raise InvalidRequest(unexpected_shape(tensor.name, self.model, shape,
                                                  array.shape))
        return array

    def result(self, value: Any) -> dict[str, np.ndarray]:
        """A request's result as its declared outputs, each of its declared dtype."""
        if not self.multi:
            return {self._single_out.name: np.asarray(value, self._dtype(self._single_out))}
        if isinstance(value, TensorBatch):
            value = value.tensors
        if not isinstance(value, Mapping):
            raise ModelError(f"model {self.model!r} declares outputs {list(self.outputs)}, "
                             f"so it must return a dict of them; it returned "
                             f"{type(value).__name__}")
        missing = [n for n in self.outputs if n not in value]
        if missing:
            raise ModelError(f"model {self.model!r} did not return outputs {missing}; it "
                             f"returned {sorted(value)}")
        return {n: np.asarray(value[n], self._dtype(t)) for n, t in self.outputs.items()}

    @staticmethod
    def _dtype(tensor: TensorConfig) -> np.dtype:
        return NUMPY_DTYPES[tensor.datatype]

    # -- the engine ----------------------------------------------------------------------
    def collate(self) -> Collate:
        """How a batch's pieces become the model's input (ragged inputs padded or listed)."""
        ragged = {t.name: Ragged(t.ragged.mode, t.ragged.axis, _pad(t))
                  for t in self.inputs.values() if t.ragged is not None}
        name = None if len(self.inputs) > 1 else self._single_in.name
        return Collate(ragged, name)

    def length_fn(self) -> Callable[[Any], float] | None:
        """A request's item length for grouping by length: along the first padded input's
        ragged axis, else the longest element of the first BYTES input; None if neither."""
        for t in self.inputs.values():
            if t.ragged is not None and t.ragged.mode == "pad":
                return length_of(t.name if self.multi else None, t.ragged.axis)
        for t in self.inputs.values():
            if t.datatype == "BYTES" or (t.ragged is not None and len(t.shape) > 1):
                return length_of(t.name if len(self.inputs) > 1 else None, 1)
        return None

    # -- the replica ---------------------------------------------------------------------
    def warmup_batch(self, size: int, warmup: WarmupConfig) -> Any:
        """A synthesized (or configured) batch of `size` items, as the model receives it."""
        arrays = {n: _warm_array(t, size, warmup) for n, t in self.inputs.items()}
        if len(arrays) == 1:
            return next(iter(arrays.values()))
        return TensorBatch(arrays)

    def check_answer(self, out: Any, size: int) -> None:
        """Raise ModelError saying what differs when `out` (the model's answer to a batch
        of `size`, as `run_batch` returns it) does not fit the declared outputs."""
        if not self.multi:
            if isinstance(out, TensorBatch):
                raise ModelError(f"model {self.model!r} declares one output "
                                 f"{self._single_out.name!r} but returned a dict of "
                                 f"{list(out.names)}; return the array alone, or declare "
                                 "every output in the config")
            if len(out) != size:
                raise ModelError(f"model {self.model!r} returned {len(out)} results for a "
                                 f"batch of {size}: it must return one per item")
            if isinstance(out, np.ndarray):
                _check_output(self.model, out, self._single_out)
            return
        if not isinstance(out, TensorBatch):
            raise ModelError(f"model {self.model!r} declares outputs {list(self.outputs)}, "
                             f"so transform/postprocess must return a dict of them; it "
                             f"returned {type(out).__name__}")
        missing = [n for n in self.outputs if n not in out.tensors]
        extra = [n for n in out.names if n not in self.outputs]
        if missing or extra:
            raise ModelError(f"model {self.model!r} returned outputs {list(out.names)} but "
                             f"declares {list(self.outputs)}"
                             + (f": missing {missing}" if missing else "")
                             + (f": undeclared {extra}" if extra else "")
                             + "; make the config's outputs and the model's dict agree")
        if len(out) != size:
            raise ModelError(f"model {self.model!r} returned {len(out)} rows per output for "
                             f"a batch of {size}: it must return one row per item")
        for name, tensor in self.outputs.items():
            _check_output(self.model, out.tensors[name], tensor)


def _as_declared(array: np.ndarray, tensor: TensorConfig, model: str) -> np.ndarray:
    """`array` if its dtype is the declared one (any byte order: made little-endian);
    BYTES from object, bytes or str arrays whose elements are bytes or str."""
    datatype, where = tensor.datatype, f"input {tensor.name!r}"
    want = NUMPY_DTYPES[datatype]
    if datatype == "BYTES":
        if array.dtype.kind in "SU":
            return _bytes_array(array.tolist(), array.shape)
        if array.dtype != object:
            raise InvalidRequest(f"{where} is declared BYTES, so it must be an object array "
                                 f"of bytes or str; got dtype {array.dtype}")
        flat = array.ravel().tolist()
        bad = next((x for x in flat if not isinstance(x, (bytes, str))), None)
        if bad is not None:
            raise InvalidRequest(f"{where} is BYTES: its elements must be bytes or str, "
                                 f"got {type(bad).__name__}")
        if any(isinstance(x, str) for x in flat):
            return _bytes_array(flat, array.shape)
        return array
    if array.dtype.kind == want.kind and array.dtype.itemsize == want.itemsize:
        return array if array.dtype == want else array.astype(want)
    got = _datatype_name(array.dtype)
    raise InvalidRequest(wrong_datatype(tensor.name, got, model, datatype)
                         + f" (.astype(np.{want.name}))"
                         + ("; objects are only accepted for BYTES" if array.dtype == object
                            else ""))


def _datatype_name(dtype: np.dtype) -> str:
    """The OIP name of a request array's dtype, or numpy's where it has none."""
    try:
        return datatype_of(np.empty(0, dtype))
    except Exception:
        return str(dtype)


def _bytes_array(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    flat = np.asarray(values, dtype=object).ravel()
    out = np.empty(len(flat), dtype=object)
    out[:] = [x.encode("utf-8") if isinstance(x, str) else x for x in flat]
    return out.reshape(shape)


def _pad(t: TensorConfig) -> Any:
    value = t.ragged.pad_value if t.ragged is not None else 0
    return value.encode("utf-8") if isinstance(value, str) else value


# A BYTES input's warm-up element when warmup.data names none: a decimal zero, which
# numeric-string models parse and text models read as text.
WARMUP_BYTES = b"0"


def _warm_array(t: TensorConfig, size: int, warmup: WarmupConfig) -> np.ndarray:
    if t.name in warmup.data:
        item = warmup.data[t.name]
        where = f"warmup.data[{t.name!r}]"
        try:
            if t.datatype == "BYTES":
                raw = np.asarray(item, dtype=object)
                one = _bytes_array(raw.ravel().tolist(), raw.shape)
            else:
                one = np.asarray(item, dtype=NUMPY_DTYPES[t.datatype])
        except (TypeError, ValueError, OverflowError) as e:
            raise ModelError(f"{where} is not {t.datatype} data ({e}): give one item as "
                             "(nested) lists of numbers, true/false for BOOL, strings for "
                             "BYTES") from None
        item_shape = t.shape[1:]
        if one.ndim != len(item_shape) or any(
                want not in (-1, got) for got, want in zip(one.shape, item_shape)):
            raise ModelError(f"{where} has shape {list(one.shape)}, but one item of input "
                             f"{t.name!r} has shape {list(item_shape)} (-1 = any size): "
                             "give one item, without the batch dim")
        return np.repeat(one[None], size, axis=0)
    dims = list(warmup.dims.get(t.name, ()))
    shape = [size] + [d if d != -1 else (dims.pop(0) if dims else 1) for d in t.shape[1:]]
    if t.datatype == "BYTES":
        return _bytes_array([WARMUP_BYTES] * int(np.prod(shape)), tuple(shape))
    return np.zeros(shape, dtype=NUMPY_DTYPES[t.datatype])


def _check_output(model: str, array: np.ndarray, tensor: TensorConfig) -> None:
    where = f"model {model!r}: output {tensor.name!r}"
    if array.ndim != len(tensor.shape):
        raise ModelError(f"{where} has shape {list(array.shape)} but is declared "
                         f"{list(tensor.shape)}: rank {array.ndim} != {len(tensor.shape)}")
    for axis, (got, want) in enumerate(zip(array.shape, tensor.shape)):
        if want != -1 and got != want:
            raise ModelError(f"{where} has shape {list(array.shape)} but is declared "
                             f"{list(tensor.shape)}: dim {axis} must be {want}")
    want = NUMPY_DTYPES[tensor.datatype]
    if tensor.datatype == "BYTES":
        ok = array.dtype.kind in "OSU"
    else:
        ok = np.can_cast(array.dtype, want, casting="same_kind")
    if not ok:
        raise ModelError(f"{where} is {array.dtype} but declared {tensor.datatype}; return "
                         f"{want} (or fix the config's datatype)")
