"""`BatchedService`: the embedded, Ray-free host of a dynamic batcher.

A `BatchHost` (the shared asyncio shell over the engine) with one local worker:
a child process by default, so batching and compute overlap, or a thread. Up to
`max_inflight_batches` batches are outstanding at once. If the worker dies, every
open request fails with `WorkerDied` and the service closes: an embedded host
has no second replica to retry on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from batching.dynamic.host import BatchHost
from batching.dynamic.policy import DynamicPolicy
from batching.embedded.runners import ProcessRunner, ThreadRunner
from batching.errors import ServiceClosed, WorkerDied
from batching.tensors import join_items
from batching.types import Request


class BatchedService:
    """Batches concurrent `submit` calls into vectorized model calls, in process.

    >>> # async with BatchedService(Square, policy=DynamicPolicy(max_batch_size=64)) as svc:
    >>> #     assert await svc.submit(3) == 9
    """

    def __init__(
        self,
        transformer: Any,
        policy: DynamicPolicy | None = None,
        *,
        init_args: Sequence[Any] = (),
        init_kwargs: dict[str, Any] | None = None,
        device: str = "cpu",
        max_inflight_batches: int = 2,
        executor: str = "process",
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_timeout_s: float = 120.0,
        collate: Callable[[list[Any]], Any] = join_items,
    ) -> None:
        if max_inflight_batches < 1:
            raise ValueError(f"max_inflight_batches={max_inflight_batches} must be >= 1")
        if executor not in ("process", "thread"):
            raise ValueError(f"executor={executor!r} must be 'process' or 'thread'")
        self.policy = policy or DynamicPolicy()
        runner_cls = ProcessRunner if executor == "process" else ThreadRunner
        self._runner = runner_cls(transformer, tuple(init_args), dict(init_kwargs or {}),
                                  device, env)
        self._runner.on_exit = self._on_worker_exit
        self._max_inflight = max_inflight_batches
        self._clock = clock
        self._start_timeout_s = start_timeout_s
        self._collate = collate  # how a batch's pieces join (batching.tensors.Collate)
        self._ids = itertools.count()
        self._host: BatchHost | None = None
        self._closed_reason = "the service is not started: use `async with` or await start()"

    async def start(self) -> BatchedService:
        if self._host is not None:
            raise RuntimeError("a BatchedService can start only once")
        self._host = BatchHost(self.policy, max_inflight=self._max_inflight, clock=self._clock,
                               collate=self._collate)
        await self._runner.start(self._start_timeout_s)
        self._host.add_replica(self._runner)
        return self

    async def __aenter__(self) -> BatchedService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Stop taking requests, run what is queued (flush reason `drain`) for up to
        `timeout_s`, then fail whatever is left with `ServiceClosed`."""
        if self._host is not None and self._host.closed_reason is None:
            await self._host.close(timeout_s)
        self._runner.close()

    async def submit(self, item: Any, *, priority: int | None = None,
                     timeout_s: float | None = None) -> Any:
        """Run one item; returns its result."""
        return await self._wait(Request(next(self._ids), (item,), True, priority, timeout_s, 1))

    async def submit_many(self, items: Sequence[Any], *, priority: int | None = None,
                          timeout_s: float | None = None) -> Any:
        """Run several items (a leading batch dimension); returns their results in order.

        The items may be split across batches and are joined again.
        """
        return await self._wait(Request(next(self._ids), items, False, priority, timeout_s,
                                        len(items)))

    async def _wait(self, request: Request) -> Any:
        if self._host is None:
            raise ServiceClosed(self._closed_reason)
        fut = self._host.submit(request)
        try:
            return await fut
        except asyncio.CancelledError:
            if not fut.done() or fut.cancelled():  # the caller gave up, not the service
                self._host.cancel(request.id)
            raise

    def stats(self) -> dict[str, Any]:
        return self._host.stats() if self._host is not None else {}

    def _on_worker_exit(self, reason: str) -> None:
        assert self._host is not None
        self._host.closed_reason = f"{reason}; create a new BatchedService"
        self._host.abort(WorkerDied(f"{reason} before the request finished"))

