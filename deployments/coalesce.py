"""Coalescing: many concurrent requests, one Ray call.

Whatever requests arrive during one event-loop tick go to the batching actor
in bundles of at most `bundle_items` items (one batch's worth), one plain Ray
call each (no timer, no added wait: the flush is scheduled with `call_soon`
when the first request of a tick arrives). A bundle's answer resolves each
request's future by its key; a bundle whose call fails (the batching actor
died) fails its requests with `WorkerDied`: nothing accepted is silently dropped.
Bundles of one batch keep the pipeline full: the first batch's answers do not
wait for the next batch's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from batching.errors import WorkerDied

log = logging.getLogger(__name__)


class Coalescer:
    """Bundles submissions to one batching actor.

    `get_actor` returns the current actor handle; it is asked again after a
    failure, since a recreated actor has a new handle.
    """

    def __init__(self, get_actor: Callable[[], Any], bundle_items: int = 64,
                 on_lost: Callable[[int], None] | None = None) -> None:
        self._get_actor = get_actor
        self._bundle_items = bundle_items
        self._on_lost = on_lost  # told how many requests a failed bundle ended (metrics)
        self._calls: set[asyncio.Task] = set()  # referenced, so none is collected mid-flight
        self._actor: Any = None
        self._keys = itertools.count()
        self._pending: list[tuple] = []
        self._futures: dict[int, asyncio.Future] = {}
        self.bundles_sent = 0

    @property
    def outstanding(self) -> int:
        """Requests sent or about to be sent that have no outcome yet."""
        return len(self._futures)

    def submit(self, items: Any, priority: int | None, timeout_s: float | None,
               control: Any = None) -> asyncio.Future:
        """`control`: a sequence model's (sequence_id, start, end); None for stateless ones."""
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        fut = loop.create_future()
        self._futures[key] = fut
        self._pending.append((key, items, priority, timeout_s, control))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        bundle: list[tuple] = []
        items = 0
        for entry in pending:
            n = len(entry[1])
            if bundle and items + n > self._bundle_items:
                self._start(loop, bundle)
                bundle, items = [], 0
            bundle.append(entry)
            items += n
        if bundle:
            self._start(loop, bundle)

    def _start(self, loop: asyncio.AbstractEventLoop, bundle: list[tuple]) -> None:
        task = loop.create_task(self._call(bundle))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, bundle: list[tuple]) -> None:
        self.bundles_sent += 1
        try:
            if self._actor is None:
                self._actor = self._get_actor()
            for key, value, error in await self._actor.infer.remote(bundle):
                fut = self._futures.pop(key, None)
                if fut is None or fut.done():
                    continue
                if error is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(error)
        except Exception as e:
            self._actor = None
            log.error("bundle of %d requests lost its batching actor: %r", len(bundle), e)
            self._fail(bundle, WorkerDied(f"the batching actor failed: {type(e).__name__}: {e}"))
        finally:
            self._fail(bundle, WorkerDied("the batching actor answered without an outcome "
                                          "for this request"))

    def _fail(self, bundle: list[tuple], error: BaseException) -> None:
        failed = 0
        for key, *_ in bundle:
            fut = self._futures.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_exception(error)
                failed += 1
        if failed and self._on_lost is not None:
            self._on_lost(failed)
