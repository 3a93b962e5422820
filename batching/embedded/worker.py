"""The process (or thread) that runs a transformer for the embedded host.

One worker runs batches one after another, in the order they were sent; the
host keeps up to `max_inflight_batches` outstanding so the next batch is already
waiting when the current one ends, and batching overlaps compute.

The process is started as `python -c` calling `main([FD])` (`runners.WORKER_MAIN`; or
`python -m batching.embedded.worker FD`) on one end of a
socketpair (not with multiprocessing's spawn), so a user's script is never
re-imported in the child. The transformer travels as a cloudpickle blob: a class
defined in a notebook or in `__main__` works. A reader thread in the child keeps
the socket drained, so the host's sends never block on a busy model.

Messages, child to host: ("ready", device) | ("setup_failed", error) |
("ok", batch_id, results, compute_s) | ("err", batch_id, error, compute_s).
"""

from __future__ import annotations

import os
import pickle
import queue
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from batching.errors import ModelError, portable
from batching.model import instantiate, run_batch


def build(blob: bytes) -> Any:
    """Instantiate the transformer described by `blob` (see `pack`)."""
    return instantiate(*cloudpickle.loads(blob))


def pack(target: Any, args: tuple, kwargs: dict) -> bytes:
    return cloudpickle.dumps((target, args, kwargs))


def serve(conn: Connection, blob: bytes, device: str) -> None:
    """The worker's main loop: set up, then run batches until told to stop."""
    try:
        model = build(blob)
        model.setup(device)
    except BaseException as e:
        conn.send(("setup_failed", portable(e)))
        return
    conn.send(("ready", device))
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            while (msg := conn.recv()) is not None:
                inbox.put(msg)
        except (EOFError, OSError):
            pass
        inbox.put(None)

    threading.Thread(target=read, name="raybatch-worker-reader", daemon=True).start()
    while (msg := inbox.get()) is not None:
        batch_id, items = msg
        t0 = time.perf_counter()
        try:
            results = run_batch(model, items)
            reply = ("ok", batch_id, results, time.perf_counter() - t0)
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                raise ModelError(f"the model's results cannot be pickled: {e}") from e
        except BaseException as e:
            conn.send(("err", batch_id, portable(e), time.perf_counter() - t0))


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[0]))
    blob, device = conn.recv()
    serve(conn, blob, device)
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
    os._exit(0)  # do not wait for the reader thread blocked in recv()
