"""Tensor data as JSON `data` lists, both ways, strictly.

In: orjson has already refused what is not JSON (NaN, Infinity, numbers that overflow a
double, nesting past 1,024); here a list must hold numbers of the tensor's kind only
(`[1.0, true]` is refused like `[true]`, fractions are no integers), within the
datatype's range (1e39 is no FP32), nested at most 32 deep. A flat list of numbers is
read in one pass by a small C module where it was built (`_jsonfast`: the Python path
checks the values' types, builds the array and checks the range in separate passes;
`benchmarks/results/2026-11-26-json-reader/`), which answers only what the Python path
would and leaves the rest, errors included, to it. Out: a numeric
output goes to orjson as a flat native-endian array (`OPT_SERIALIZE_NUMPY`), no Python
list in between; NaN and Infinity have no JSON spelling, so such an output is refused
with the fix (binary output), never written as invalid JSON or silently as null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from deployments.protocol.datatypes import NUMPY_DTYPES, as_bytes_list, datatype_of
from deployments.protocol.limits import shown

# The Python types a JSON `data` list may hold, per kind of target datatype; orjson
# parses integers as int, other numbers as float (always finite), true/false as bool.
_JSON_TYPES = {"b": {bool}, "u": {int}, "i": {int}, "f": {int, float}}
_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}  # numpy kinds each may be read as
_WANTED = {"b": "true/false", "u": "integers", "i": "integers", "f": "numbers"}
MAX_NESTING = 32  # numpy's own limit on dims; deeper JSON nesting is refused before numpy
_TYPE_WORDS = {bool: "true/false", int: "integers", float: "fractions", str: "strings",
               type(None): "null", dict: "objects"}


def decode_json_data(data: Any, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """A tensor from its JSON `data` (flat row-major or nested lists), reshaped to `shape`."""
    if not isinstance(data, list):
        raise InvalidRequest(
            f"{where}: 'data' must be a JSON array (flat in row-major order, or nested), "
            f"got {type(data).__name__}"
        )
    expected = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten_strings(data, where)
    else:
        flat = _json_numbers(data, datatype, where)
    if flat.size != expected:
        raise InvalidRequest(
            f"{where}: 'data' holds {flat.size} elements but shape {shown(list(shape))} needs "
            f"{expected}; send exactly one element per position of the shape"
        )
    return flat.reshape(shape)


def _leaf_types(data: list, where: str) -> set[type]:
    """The Python types of the values in `data`, nested at most `MAX_NESTING` lists deep."""
    types: set[type] = set()
    level, depth = [data], 0
    while level:
        depth += 1
        if depth > MAX_NESTING:
            raise InvalidRequest(
                f"{where}: 'data' is nested more than {MAX_NESTING} lists deep; send a flat "
                "list in row-major order, or lists nested like the shape"
            )
        below: list[list] = []
        for values in level:
            found = set(map(type, values))
            if list in found:
                found.discard(list)
                below.extend(v for v in values if type(v) is list)
            types |= found
        level = below
    return types


def _json_numbers(data: list, datatype: str, where: str) -> np.ndarray:
    """Numbers of one datatype, strictly: no true/false among numbers, no fractions among
    integers, nothing outside the datatype's range (1e39 is not an FP32).

    The values' types are looked at first (one C-level pass): a flat list of the target's
    kind is read as such (`_flat`); anything else numpy reads, and its kind says most of
    what was in it, but not true/false beside numbers (read as 1/0), so the types are
    looked at again there."""
    target = NUMPY_DTYPES[datatype]
    if _fast is not None and data and type(data[0]) is not list:
        code = _FAST_CODES.get(datatype)
        raw = None if code is None else _fast.flat(data, code)
        if raw is not None:  # what the lines below would give, checked and cast in C
            return np.frombuffer(raw, target)
    parsed = _flat(data, target) if data and type(data[0]) is not list else None
    if parsed is None:
        parsed = _numbers(data, datatype, target, where)
        if parsed.size == 0:
            return np.empty(0, dtype=target)
    if target.kind == "f":
        return _floats(parsed, datatype, target, where)
    if target.kind != "b":
        _check_int_range(parsed, datatype, target, where)
    return parsed.astype(target, copy=False).ravel()


def _flat(data: list, target: np.dtype) -> np.ndarray | None:
    """A flat list of the target's own kind, read without numpy's type discovery: the
    array `np.array(data)` would give (numbers with a fraction among them as float64,
    integers as int64, true/false as bool), or None where that is not certain."""
    types = set(map(type, data))
    if target.kind == "f":
        if float not in types or not types <= _FLOAT_TYPES:
            return None
        wide: Any = np.float64
    else:
        want, wide = _FLAT[target.kind]
        if types != want:
            return None
    try:
        return np.fromiter(data, wide, len(data))
    except (OverflowError, ValueError, TypeError):  # past int64 or a double: the long way
        return None


_FLOAT_TYPES = {int, float}
# The compiled one-pass reader of a flat list (deployments/protocol/_jsonfast.c), where
# `make setup` could build it; it answers only what the Python path would, else None.
try:
    from deployments.protocol import _jsonfast as _fast
except ImportError:  # no C compiler at install: the Python path alone
    _fast = None
_FAST_CODES = {name: f"{dt.kind}{dt.itemsize}" for name, dt in NUMPY_DTYPES.items()
               if dt.kind in "iuf" and dt.itemsize in (1, 2, 4, 8) and dt.isnative
               and not (dt.kind == "f" and dt.itemsize < 4)}
_FLAT = {"b": ({bool}, np.bool_), "u": ({int}, np.int64), "i": ({int}, np.int64)}


def _numbers(data: list, datatype: str, target: np.dtype, where: str) -> np.ndarray:
    """`data` read by numpy, its kinds checked (what `_flat` does not take)."""
    try:
        parsed = np.array(data)
    except (ValueError, OverflowError) as exc:  # ragged, or nested past numpy's dims
        _leaf_types(data, where)  # the clearer message for nesting too deep
        raise InvalidRequest(
            f"{where}: 'data' is not a rectangular array of numbers ({str(exc)[:120]}); "
            "send a flat list, or nested lists of equal length"
        ) from None
    if parsed.size == 0:
        return parsed
    kind = parsed.dtype.kind
    if kind not in _KINDS[target.kind] or (
            target.kind != "b" and bool in _leaf_types(data, where)):
        parsed = _slow_numbers(data, datatype, target, where)
    return parsed


def _slow_numbers(data: list, datatype: str, target: np.dtype, where: str) -> np.ndarray:
    types = _leaf_types(data, where)
    wrong = types - _JSON_TYPES[target.kind]
    if wrong == {float} and target.kind != "f":
        _check_huge_integers(data, datatype, where)
    if wrong:
        got = ", ".join(sorted(_TYPE_WORDS.get(t, t.__name__) for t in wrong))
        raise InvalidRequest(
            f"{where}: datatype {datatype} needs {_WANTED[target.kind]} in 'data', got {got}"
        )
    if target.kind == "f":
        return np.array(data, dtype=np.float64)
    try:  # integers only, some past 2**63: exact, as int64 or else as uint64
        return np.array(data, dtype=np.int64)
    except OverflowError:
        try:
            return np.array(data, dtype=np.uint64)
        except OverflowError:
            raise InvalidRequest(
                f"{where}: 'data' mixes negative integers with integers >= 2**63, outside "
                f"the range of {datatype}; use values that fit {datatype}"
            ) from None


def past_64_bits(value: Any) -> bool:
    """An integer past 64 bits as orjson reads it: a float with no fraction, so large that
    it was sent as an integer (a JSON body's `data` or a parameter)."""
    return type(value) is float and value.is_integer() and abs(value) >= 2**63


def _check_huge_integers(data: list, datatype: str, where: str) -> None:
    """orjson reads an integer past 64 bits as a float: say it is out of range (it is
    one), not that it has a fraction."""
    for v in np.array(data, dtype=object).ravel():
        if past_64_bits(v):
            raise InvalidRequest(
                f"{where}: 'data' holds {int(v)}, outside the range of {datatype}; use "
                f"values that fit {datatype}")


def _floats(parsed: np.ndarray, datatype: str, target: np.dtype, where: str) -> np.ndarray:
    if target.itemsize < 8:
        limit = _FLOAT_MAX[target.itemsize]
        # from the extremes, not np.abs: the abs of int64's minimum is itself, negative
        largest = max(float(parsed.max()), -float(parsed.min()))
        if largest > limit:
            raise InvalidRequest(
                f"{where}: 'data' holds {largest:g}, outside the range of {datatype} "
                f"(largest {limit:g}); use FP64 or scale the values"
            )
    return parsed.astype(target, copy=False).ravel()


def _check_int_range(parsed: np.ndarray, datatype: str, target: np.dtype, where: str) -> None:
    if parsed.dtype == target:
        return
    info = np.iinfo(target)
    low, high = int(parsed.min()), int(parsed.max())
    if low < info.min or high > info.max:
        raise InvalidRequest(
            f"{where}: 'data' holds {low if low < info.min else high}, outside the range "
            f"of {datatype} [{info.min}, {info.max}]; use a wider datatype"
        )


def _flatten_strings(data: list, where: str) -> np.ndarray:
    out: list[bytes] = []
    stack: list[Any] = [iter(data)]
    while stack:
        item = next(stack[-1], _DONE)
        if item is _DONE:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            raise InvalidRequest(
                f"{where}: datatype BYTES needs JSON strings in 'data', got {shown(item)}; "
                "send raw bytes with the binary tensor data extension instead"
            )
    array = np.empty(len(out), dtype=object)
    array[:] = out
    return array


_DONE = object()
_FLOAT_MAX = {2: float(np.finfo(np.float16).max), 4: float(np.finfo(np.float32).max)}


def json_data(array: np.ndarray, name: str) -> np.ndarray | list[str]:
    """An output's flat row-major JSON `data`: a native-endian array orjson writes itself
    (`OPT_SERIALIZE_NUMPY`), or a list of strings for BYTES, which must be valid UTF-8.

    NaN and Infinity have no JSON spelling (orjson would write them as null), so an
    output holding them is refused with the fix: ask for it as binary data."""
    if datatype_of(array) == "BYTES":
        try:
            return [b.decode("utf-8") for b in as_bytes_list(array)]
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"output '{name}' holds bytes that are not UTF-8 and cannot travel in JSON; "
                "request it with parameters.binary_data=true"
            ) from None
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidRequest(
            f"output '{name}' holds NaN or Infinity, which JSON cannot carry; request it "
            "with parameters.binary_data=true (binary tensor data carries every float)"
        )
    native = array.astype(array.dtype.newbyteorder("="), copy=False)
    return np.ascontiguousarray(native).reshape(-1)
