"""The Open Inference Protocol's datatypes and the numpy dtypes they mean.

One table both ways (little-endian, as the binary tensor extension requires;
BYTES is an object array of `bytes`), and the two checks every codec module
needs: is a datatype string one Raybatch speaks, and which datatype a model's
output array has. Kept apart so metadata and the tensor codec both import it
without importing each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batching.errors import InvalidRequest, ModelError
from deployments.protocol.limits import shown

# OIP datatype → numpy dtype, little-endian as the binary extension requires.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
SUPPORTED = ", ".join(NUMPY_DTYPES)
_BY_NUMPY = {dt: name for name, dt in NUMPY_DTYPES.items() if name != "BYTES"}


def check_datatype(datatype: Any, where: str) -> str:
    """Return `datatype` if Raybatch speaks it, else raise `InvalidRequest` saying why.

    >>> check_datatype("FP32", "input 'x'")
    'FP32'
    """
    if datatype == "BF16":
        raise InvalidRequest(
            f"{where} has datatype BF16, which Raybatch does not support "
            "(numpy has no bfloat16); send it as FP32 or FP16"
        )
    if not isinstance(datatype, str) or datatype not in NUMPY_DTYPES:
        raise InvalidRequest(
            f"{where} has unknown datatype {shown(datatype)}; use one of {SUPPORTED}"
        )
    return datatype


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype of a numpy array; str, bytes and object arrays are BYTES.

    >>> datatype_of(np.zeros(2, np.float32))
    'FP32'
    """
    dtype = array.dtype
    name = _BY_NUMPY.get(dtype)  # native little-endian: the usual case, one lookup
    if name is not None:
        return name
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_NUMPY.get(dtype.newbyteorder("<")) if dtype.kind != "b" else "BOOL"
    if name is None:
        raise ModelError(
            f"the model returned an array of dtype {array.dtype}, which has no "
            f"Open Inference Protocol datatype; return one of {SUPPORTED}"
        )
    return name


def as_bytes_list(array: np.ndarray) -> list[bytes]:
    """A BYTES tensor's elements, flat: bytes as they are, anything else as its str in
    UTF-8 (like tritonclient's `serialize_byte_tensor`)."""
    return [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in array.ravel().tolist()]
