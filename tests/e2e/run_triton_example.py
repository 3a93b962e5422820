"""Runs one of Triton's example programs, unchanged, then closes the HTTP clients it left open.

`python tests/e2e/run_triton_example.py PROGRAM ARGS...` runs PROGRAM as `__main__`
with ARGS, as `python PROGRAM ARGS...` would, with one difference at the end: every
`tritonclient.http.InferenceServerClient` still alive is closed while the interpreter
still runs, instead of by the client's `__del__` during interpreter shutdown.

Why: that `__del__` calls `close()`, which joins the client's gevent pool. When the
program's last `get_result()` found its greenlet already finished (two answers that
arrived in the same turn of gevent's loop: a batched pair often does), the pool still
holds that greenlet until the loop runs its callbacks, and a join started during
interpreter shutdown never gets them run: the program prints every answer, then hangs
forever in gevent's hub (about 1 run in 75 under a CPU hog, here; Triton's own issue
on that `__del__`: triton-inference-server/server#4223). The same join made before
shutdown returns at once. The programs' requests, answers and exit codes are theirs.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys


def close_http_clients() -> None:
    """Close every tritonclient HTTP client still alive (what its `__del__` would do)."""
    client = sys.modules.get("tritonclient.http")
    if client is None:
        return
    for obj in gc.get_objects():
        if isinstance(obj, client.InferenceServerClient):
            obj.close()


def main() -> None:
    program, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(program))  # as `python PROGRAM` sets it
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        close_http_clients()


if __name__ == "__main__":
    main()
