"""How a call's arguments and answer go into a direct connection's frame
(`deployments.wire.link`): pickle protocol 5, with large tensors out of band.

Why: pickled in band, a batch's arrays are copied into the pickle on the way out and out
of it on the way in, besides the kernel's copies; a 4 MiB batch spent more time in those
copies (and the page faults of their fresh buffers) than on the wire
(`benchmarks.serve.channels`). Out of band, each contiguous buffer of at least
`OOB_MIN_BYTES` (a numpy array's data) is left out of the pickle and written as it lies
in memory, after it, in the same frame (`sendmsg` of the parts: no join); the receiver
hands `pickle.loads` views of the frame it read, so each array is made over the received
bytes without a copy. Smaller buffers stay in band: one part, as before.

An out-of-band frame's kind carries `OOB`; its payload is
`[buffers u32][pickle length u32][each buffer's length u64]...[pickle][buffer]...`.
An array is written as it lies, possibly after `encode` has returned (an event loop's
transport writes what the socket did not take at once), so what is sent is never changed
after: the engine sends requests' arrays it only reads, a replica the arrays its model
returned (a model that changes an array it returned would race with in-band pickling too).
Arrays decoded from a read-only frame (a `bytes`) are copied into writable memory first;
an array that was read-only where it was sent comes back read-only (pickle says so in the
frame), as it would in band: a model gets its inputs writable all the same, copied where
they are not (`batching.model.writable`).
A payload whose lengths do not add up is refused (`ValueError`), never read past.

Arrays are pickled as numpy pickles them at protocol 5 (its own `_frombuffer` rebuilds
them: any reader that unpickles numpy reads these frames), but with the dtype as its
string (`'<f4'`) rather than a pickled `dtype` object, whose reduction is most of the
cost of pickling a batch's few objects (`_reduce_array`; `benchmarks.serve.codec_cost`).
Only plain dtypes (numbers, booleans, fixed-width strings), whose string names
them exactly, and C-contiguous arrays go this way; anything else (dates, records) as
numpy reduces it.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
from typing import Any

import numpy as np

OOB = 0x80  # in a frame's kind: the payload carries out-of-band buffers
KIND = 0x7F  # the kind itself
OOB_MIN_BYTES = 16 * 1024  # a smaller buffer is copied into the pickle: one part
_COUNTS = struct.Struct("<II")  # buffers, pickle length
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]  # numpy's own rebuilder, wherever it lives
_PLAIN_KINDS = frozenset("biufcSU")  # dtypes their `.str` names, which export a buffer


def _reduce_array(a: np.ndarray) -> Any:
    """An exact ndarray's reduction: numpy's own, with its dtype as a string."""
    dtype = a.dtype
    if dtype.kind in _PLAIN_KINDS and dtype.metadata is None and a.flags.c_contiguous:
        return _FROMBUFFER, (pickle.PickleBuffer(a), dtype.str, a.shape, "C")
    return a.__reduce_ex__(5)


_table: dict[type, Any] = {}  # copyreg's table and arrays' reduction, see `_dispatch_table`
_table_of = -1  # the size of copyreg's table it was copied from


def _dispatch_table() -> dict[type, Any]:
    """copyreg's table with arrays' reduction added: copied again whenever copyreg's has
    grown (a library may register a type after this module is loaded; one that registers
    a type a second time, with another reducer, is seen once the table grows again). A
    plain dict: a lookup in a live view (a `ChainMap`) costs a Python call for every
    object pickled that is not a builtin container, a tenth to a fifth of a bundle's
    encoding."""
    global _table, _table_of
    if _table_of != len(copyreg.dispatch_table):
        _table_of = len(copyreg.dispatch_table)
        _table = {**copyreg.dispatch_table, np.ndarray: _reduce_array}
    return _table


def encode(value: Any) -> tuple[int, list[bytes | memoryview]]:
    """(`OOB` or 0, the payload's parts) of `value`."""
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: in band
            return True
        if raw.nbytes < OOB_MIN_BYTES:
            return True
        buffers.append(raw)
        return False

    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=out_of_band)
    pickler.dispatch_table = _dispatch_table()
    pickler.dump(value)
    main = out.getvalue()
    if not buffers:
        return 0, [main]
    lengths = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return OOB, [_COUNTS.pack(len(buffers), len(main)) + lengths, main, *buffers]


def encoded(value: Any) -> tuple[int, bytes]:
    """(`OOB` or 0, the payload as one bytes): where one write of a joined frame is wanted."""
    flag, parts = encode(value)
    return flag, parts[0] if len(parts) == 1 else b"".join(parts)


def decode(payload: bytes | bytearray | memoryview, oob: int) -> Any:
    """The value in `payload` (`oob`: the frame's kind had `OOB`)."""
    if not oob:
        return pickle.loads(payload)
    view = memoryview(payload)
    if view.nbytes < _COUNTS.size:
        raise ValueError("an out-of-band frame shorter than its counts")
    count, main_len = _COUNTS.unpack_from(view)
    at = _COUNTS.size + 8 * count
    if at > view.nbytes:
        raise ValueError(f"an out-of-band frame of {view.nbytes} bytes says {count} buffers")
    lengths = struct.unpack_from(f"<{count}Q", view, _COUNTS.size)
    if at + main_len + sum(lengths) != view.nbytes:
        raise ValueError("an out-of-band frame whose lengths do not add up to its size")
    main = view[at:at + main_len]
    at += main_len
    buffers = []
    for n in lengths:
        part = view[at:at + n]
        buffers.append(bytearray(part) if view.readonly else part)
        at += n
    return pickle.loads(main, buffers=buffers)
