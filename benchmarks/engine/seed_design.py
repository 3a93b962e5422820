"""The seed's batching design, re-implemented with the stdlib as a baseline.

Faithful to the original, not sabotaged: the only waits are the design's own
1 ms polls and its fixed timeout.

- `submit` puts (request id, item) on a thread-safe inbox queue.
- A batcher *thread* sleep-polls the inbox every 1 ms, draining whatever is
  there; it sends a batch when it holds `max_batch_size` items, or when a
  FIXED `timeout_s` has passed since the batch's first item arrived.
- Each batch goes, as one stacked array with its ids, to a worker *process*
  through a `multiprocessing.Queue`; there is no bound on batches in flight.
- The worker runs the model and puts (ids, results) on a result queue; a
  result thread posts every result into a dict keyed by request id.
- Each caller sleep-polls that dict (`await asyncio.sleep(0.001)`) until its
  id appears, then takes its result.

It exposes the same `async with` / `submit` / `stats()` surface as
`BatchedService`, so the load generator drives both alike.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import queue
import threading
import time
from collections import Counter
from typing import Any

import numpy as np  # noqa: F401  (the doctest uses it)

from batching.model import as_batch

POLL_S = 0.001


def _worker_main(model_cls, init_args, init_kwargs, batches: mp.Queue, results: mp.Queue) -> None:
    model = model_cls(*init_args, **init_kwargs)
    model.setup("cpu")
    results.put(("ready", None))
    while (msg := batches.get()) is not None:
        ids, items = msg
        try:
            results.put((ids, list(model(items))))
        except Exception as e:  # the seed failed the whole batch
            results.put((ids, e))


class SeedService:
    """Sleep-polling batcher thread + worker process + polled result dict.

    >>> from deployments.models import Sleep
    >>> async def main():
    ...     async with SeedService(Sleep, max_batch_size=8) as svc:
    ...         return await svc.submit(np.ones(8, np.float32))
    >>> asyncio.run(main()).tolist()
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    """

    def __init__(
        self,
        model_cls: type,
        *,
        max_batch_size: int = 64,
        timeout_s: float = 0.002,
        init_args: tuple = (),
        init_kwargs: dict | None = None,
    ) -> None:
        self.model_cls = model_cls
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.init_args = init_args
        self.init_kwargs = init_kwargs or {}
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._results: dict[int, Any] = {}
        self._running = False
        self._batches = 0
        self._items = 0
        self._by_size: Counter = Counter()
        self._by_reason: Counter = Counter()

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> SeedService:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.stop)

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self._to_worker: mp.Queue = ctx.Queue()
        self._from_worker: mp.Queue = ctx.Queue()
        args = (self.model_cls, self.init_args, self.init_kwargs,
                self._to_worker, self._from_worker)
        self._proc = ctx.Process(target=_worker_main, args=args, daemon=True)
        self._proc.start()
        while True:
            try:
                self._from_worker.get(timeout=0.2)  # "ready"
                break
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(
                        f"seed worker exited with code {self._proc.exitcode} before setup finished"
                    ) from None
        self._running = True
        self._batcher = threading.Thread(target=self._batch_loop, name="seed-batcher", daemon=True)
        self._poster = threading.Thread(target=self._result_loop, name="seed-results", daemon=True)
        self._batcher.start()
        self._poster.start()

    def stop(self) -> None:
        self._running = False
        self._batcher.join(timeout=5)
        self._to_worker.put(None)
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
        self._from_worker.put(None)  # wakes the result thread
        self._poster.join(timeout=5)

    # -- callers ---------------------------------------------------------------------

    async def submit(self, item: Any) -> Any:
        rid = next(self._ids)
        self._inbox.put((rid, item))
        while rid not in self._results:
            await asyncio.sleep(POLL_S)
        result = self._results.pop(rid)
        if isinstance(result, Exception):
            raise result
        return result

    def stats(self) -> dict[str, Any]:
        return {
            "batches": self._batches,
            "items": self._items,
            "mean_batch_size": self._items / self._batches if self._batches else 0.0,
            "by_size": dict(sorted(self._by_size.items())),
            "by_reason": dict(self._by_reason),
            "queued": self._inbox.qsize(),
        }

    # -- threads ---------------------------------------------------------------------

    def _batch_loop(self) -> None:
        pending: list[tuple[int, Any]] = []
        first_at = 0.0
        while self._running:
            while len(pending) < self.max_batch_size:
                try:
                    pending.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
                if len(pending) == 1:
                    first_at = time.monotonic()  # the fixed timeout runs from the first item
            if len(pending) >= self.max_batch_size:
                self._send(pending, "max_batch_size")
                pending = []
            elif pending and time.monotonic() - first_at >= self.timeout_s:
                self._send(pending, "timeout")
                pending = []
            else:
                time.sleep(POLL_S)

    def _send(self, pending: list[tuple[int, Any]], reason: str) -> None:
        ids = [rid for rid, _ in pending]
        self._to_worker.put((ids, as_batch([item for _, item in pending])))
        self._batches += 1
        self._items += len(ids)
        self._by_size[len(ids)] += 1
        self._by_reason[reason] += 1

    def _result_loop(self) -> None:
        while (msg := self._from_worker.get()) is not None:
            ids, results = msg
            if isinstance(results, Exception):
                results = [results] * len(ids)
            for rid, result in zip(ids, results):
                self._results[rid] = result
