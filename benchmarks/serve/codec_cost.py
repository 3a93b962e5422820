"""CPU of the direct connection's codec (`deployments.wire.codec`) for the four frames of one
batch of the actor shape, in one process, without sockets.

    python -m benchmarks.serve.codec_cost [--rows 55] [--calls 20000]

The frames: the ingress's bundle to the batching actor (one block entry of `rows` rows of
the demo mlp's FP32 [256] input, with its stamp), the batch to the replica, the
replica's answer, the bundle's answer back to the ingress. Each is encoded and decoded
`calls` times by the codec, and by the same out-of-band framing with numpy's own
reduction of the arrays (`pickle.dumps(..., protocol=5)` with a buffer callback: what the
codec did before it pickled a dtype as its string); every decoded value is checked
against the one sent. Printed: microseconds of process CPU per encode and per decode.
Why: each frame is encoded once and decoded once per batch, on the critical path of a
batch's round trip (ingress, batching actor, replica, batching actor, ingress).
"""

from __future__ import annotations

import argparse
import pickle
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from deployments.wire import codec
from deployments.wire.bundles import Entry, Outcome, pack, pack_outcomes, stamp


def frames(rows: int) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((rows, 256), dtype=np.float32)
    bundle = pack([Entry(1, x, None, time.monotonic() + 30.0, None, rows)])
    return {"bundle": (bundle, "c" * 32, stamp(), None), "batch": ((x,),),
            "replica answer": (x * 2, 0.001),
            "bundle answer": pack_outcomes(bundle, [Outcome(1, x * 2)])}


def numpy_reduce_encode(value: Any) -> tuple[int, list[Any]]:
    """The codec's framing with numpy's own array reduction (a pickled dtype object)."""
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < codec.OOB_MIN_BYTES:
            return True
        buffers.append(raw)
        return False

    main = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    if not buffers:
        return 0, [main]
    lengths = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return codec.OOB, [struct.pack("<II", len(buffers), len(main)) + lengths, main, *buffers]


def cpu_us(fn: Callable[[], Any], calls: int) -> float:
    t = time.process_time()
    for _ in range(calls):
        fn()
    return 1e6 * (time.process_time() - t) / calls


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if hasattr(a, "__dict__") or hasattr(a, "__slots__"):
        return type(a) is type(b) and same(_fields(a), _fields(b))
    return a == b


def _fields(obj: Any) -> list[Any]:
    names = getattr(obj, "__slots__", None) or sorted(vars(obj))
    return [getattr(obj, n) for n in names]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=55, help="rows in the batch (default 55)")
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    print(f"{'frame':15s} {'codec enc':>10s} {'dec':>6s}   {'numpy reduce enc':>16s} "
          f"{'dec':>6s}   (us of CPU, {args.rows} rows)")
    for name, value in frames(args.rows).items():
        row = []
        for encode in (codec.encode, numpy_reduce_encode):
            flag, parts = encode(value)
            payload = bytearray(b"".join(bytes(p) for p in parts))
            if not same(value, codec.decode(payload, flag)):
                raise SystemExit(f"{name}: the decoded value is not the one sent")
            row += [cpu_us(lambda e=encode, v=value: e(v), args.calls),
                    cpu_us(lambda p=payload, f=flag: codec.decode(p, f), args.calls)]
        print(f"{name:15s} {row[0]:10.2f} {row[1]:6.2f}   {row[2]:16.2f} {row[3]:6.2f}")


if __name__ == "__main__":
    main()
