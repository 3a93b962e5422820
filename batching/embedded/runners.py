"""Where the embedded host's model runs: a child process (default) or a thread.

Both are `ReplicaClient`s for `BatchHost`: `start()` returns once the model's
`setup` finished (raising what it raised), `run(items)` runs one batch and
returns (results, compute_s), `close()` stops the worker. The process runner
costs one pickle round trip per batch and buys true parallelism; the thread
runner suits models that release the GIL, unpicklable models, and tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from batching.embedded.worker import pack
from batching.errors import WorkerDied
from batching.loop import ReplicaDied
from batching.model import instantiate, run_batch

# The child's entry: its module imported, not run as __main__ with `-m` (its package,
# imported first, imports it too, and runpy warns of that on every start).
WORKER_MAIN = ("import os, sys; from batching.embedded.worker import main; "
               "main(sys.argv[1:]); os._exit(0)")


class ProcessRunner:
    name = "worker-process"

    def __init__(self, target: Any, args: tuple, kwargs: dict, device: str,
                 env: dict[str, str] | None = None) -> None:
        self._blob = pack(target, args, kwargs)
        self._device = device
        self._env = env or {}
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self.on_exit: Callable[[str], None] = lambda reason: None
        self._exited = False

    async def start(self, timeout_s: float) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, **self._env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=env,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send((self._blob, self._device))
        self._loop = asyncio.get_running_loop()
        first = await self._loop.run_in_executor(None, self._first_message, timeout_s)
        if first[0] == "setup_failed":
            self.close()
            raise first[1]
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        threading.Thread(target=self._send_loop, args=(self._conn, self._loop),
                         name="raybatch-sender", daemon=True).start()

    def _send_loop(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        # Pickling and writing a batch is long next to taking one request: done here,
        # not on the event loop, which meanwhile keeps taking requests and results.
        while (msg := self._outbox.get()) is not None:
            try:
                conn.send(msg)
            except Exception as e:  # unpicklable items, or the worker is gone
                try:
                    loop.call_soon_threadsafe(_fail_unsent, self._pending, msg[0], e)
                except RuntimeError:
                    return  # the loop is closed: nobody is waiting
                if isinstance(e, OSError):
                    return

    def _first_message(self, timeout_s: float) -> tuple:
        assert self._conn is not None and self._proc is not None
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(0.05):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise WorkerDied(f"model worker exited with code {code} during setup")
            if time.monotonic() > deadline:
                self.close()
                raise WorkerDied(f"model worker did not finish setup within {timeout_s} s")
        return self._conn.recv()

    async def run(self, items: Any) -> tuple[Any, float]:
        if self._exited or self._conn is None or self._loop is None:
            raise ReplicaDied("the model worker process is not running")
        batch_id = next(self._ids)
        fut = self._loop.create_future()
        self._pending[batch_id] = fut
        self._outbox.put((batch_id, items))
        return await fut

    def _on_readable(self) -> None:
        conn = self._conn
        try:
            while conn is not None and conn.poll():
                kind, batch_id, payload, compute_s = conn.recv()
                fut = self._pending.pop(batch_id)
                if fut.done():
                    continue
                if kind == "ok":
                    fut.set_result((payload, compute_s))
                else:
                    fut.set_exception(payload)
        except (EOFError, OSError):
            self._died()

    def _died(self) -> None:
        if self._exited:
            return
        self._exited = True
        if self._loop is not None and self._conn is not None:
            self._loop.remove_reader(self._conn.fileno())
        code = self._proc.wait(timeout=5) if self._proc is not None else None
        reason = f"model worker process exited with code {code}"
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ReplicaDied(reason))
        self._pending.clear()
        self.on_exit(reason)

    def close(self, timeout_s: float = 5.0) -> None:
        self._exited = True
        self._outbox.put(None)
        if self._conn is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._conn.fileno())
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _fail_unsent(pending: dict[int, asyncio.Future], batch_id: int, error: BaseException) -> None:
    fut = pending.pop(batch_id, None)
    if fut is not None and not fut.done():
        fut.set_exception(RuntimeError(f"the batch could not be sent to the model worker: {error}"))


class ThreadRunner:
    name = "worker-thread"

    def __init__(self, target: Any, args: tuple, kwargs: dict, device: str,
                 env: dict[str, str] | None = None) -> None:
        self._factory = (target, args, kwargs)
        self._device = device
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raybatch-model")
        self._model: Any = None
        self.on_exit: Callable[[str], None] = lambda reason: None

    async def start(self, timeout_s: float) -> None:
        def setup() -> Any:
            model = instantiate(*self._factory)
            model.setup(self._device)
            return model

        fut = asyncio.get_running_loop().run_in_executor(self._pool, setup)
        self._model = await asyncio.wait_for(fut, timeout_s)

    async def run(self, items: Any) -> tuple[Any, float]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._call, items)

    def _call(self, items: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        results = run_batch(self._model, items)
        return results, time.perf_counter() - t0

    def close(self, timeout_s: float = 5.0) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
