"""`BatchedService`: the embedded, Ray-free host of a dynamic batcher.

A thin asyncio shell over the pure engine: it alone reads the clock, sleeps
(one timer armed at the policy's `deadline()`), and talks to the worker. The
`DynamicBatcher` decides what forms a batch and when; the `Ledger` decides
which request gets which result and when it is released; the runner executes
batches in a worker process (or thread), up to `max_inflight_batches` at once.

Every submit in one event-loop tick is batched together: the pump runs once per
tick (`call_soon`), so a burst forms one batch without any added wait.
Each request ends exactly once: with its result, its own error, `Cancelled`,
`DeadlineExceeded`, `WorkerDied` or `ServiceClosed`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from batching.dynamic import DynamicBatcher
from batching.errors import Cancelled, ServiceClosed, WorkerDied
from batching.ledger import Ledger, Outcome
from batching.policy import DynamicPolicy
from batching.runners import ProcessRunner, ThreadRunner
from batching.types import Batch, Request

log = logging.getLogger(__name__)


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
    ) -> None:
        if max_inflight_batches < 1:
            raise ValueError(f"max_inflight_batches={max_inflight_batches} must be >= 1")
        if executor not in ("process", "thread"):
            raise ValueError(f"executor={executor!r} must be 'process' or 'thread'")
        self.policy = policy or DynamicPolicy()
        runner_cls = ProcessRunner if executor == "process" else ThreadRunner
        self._runner = runner_cls(transformer, tuple(init_args), dict(init_kwargs or {}), device, env)
        self._runner.on_message = self._on_message
        self._runner.on_exit = self._on_worker_exit
        self._engine = DynamicBatcher(self.policy)
        self._ledger = Ledger(self.policy.preserve_ordering)
        self._max_inflight = max_inflight_batches
        self._clock = clock
        self._start_timeout_s = start_timeout_s
        self._ids = itertools.count()
        self._futures: dict[int, asyncio.Future] = {}
        self._requests: dict[int, Request] = {}
        self._inflight: dict[int, Batch] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._state = "new"  # new → running → closing → closed
        self._closed_reason = "the service is not started: use `async with` or await start()"
        self._idle = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> BatchedService:
        if self._state != "new":
            raise RuntimeError(f"BatchedService is {self._state}; it can start only once")
        self._loop = asyncio.get_running_loop()
        await self._runner.start(self._start_timeout_s)
        self._state = "running"
        return self

    async def __aenter__(self) -> BatchedService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Stop taking requests, run what is queued (flush reason `drain`) for up to
        `timeout_s`, then fail whatever is left with `ServiceClosed`."""
        if self._state in ("closing", "closed", "new"):
            self._state = "closed" if self._state == "new" else self._state
            return
        self._state = "closing"
        self._closed_reason = "the service is closing"
        self._engine.drain()
        self._pump()
        if self._futures:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        self._abort(ServiceClosed(f"the service closed before the request could finish "
                                  f"(drain timeout {timeout_s} s)"))
        self._runner.close()

    # -- requests -----------------------------------------------------------------------
    async def submit(self, item: Any, *, priority: int | None = None,
                     timeout_s: float | None = None) -> Any:
        """Run one item; returns its result."""
        rid = next(self._ids)
        return await self._enqueue(Request(rid, (item,), True, priority, timeout_s, 1))

    async def submit_many(self, items: Sequence[Any], *, priority: int | None = None,
                          timeout_s: float | None = None) -> Any:
        """Run several items (a leading batch dimension); returns their results in order.

        The items may be split across batches; an ndarray comes back as one ndarray.
        """
        rid = next(self._ids)
        return await self._enqueue(Request(rid, items, False, priority, timeout_s, len(items)))

    async def _enqueue(self, request: Request) -> Any:
        if self._state != "running":
            raise ServiceClosed(self._closed_reason)
        assert self._loop is not None
        # No await between engine.submit and registering the future, so an outcome can
        # never arrive for an id we do not know. submit raises before anything is kept.
        self._engine.submit(request, self._clock())
        fut = self._loop.create_future()
        self._ledger.open(request)
        self._futures[request.id] = fut
        self._requests[request.id] = request
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)
        try:
            return await fut
        except asyncio.CancelledError:
            if request.id in self._futures:  # the caller gave up, not the service
                self._engine.cancel(request.id, self._clock())
                self._settle(self._ledger.fail(request.id, Cancelled(
                    f"request {request.id} was cancelled by its caller")))
            raise

    def stats(self) -> dict[str, Any]:
        a, b = self._engine.latency.coefficients
        return {
            **self._engine.stats.as_dict(),
            "queued_requests": self._engine.queued_requests,
            "queued_items": self._engine.queued_items,
            "inflight_batches": len(self._inflight),
            "open_requests": len(self._futures),
            "latency_model": {"a_ms": a * 1e3, "b_ms_per_cost": b * 1e3,
                              "warm": self._engine.latency.warm},
        }

    # -- the pump: the only place batches are formed -------------------------------------
    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock()
        while (batch := self._engine.next_batch(now, self._max_inflight - len(self._inflight))):
            self._dispatch(batch)
        for failure in self._engine.take_failures():
            self._settle(self._ledger.fail(failure.request_id, failure.error))
        self._arm_timer(self._engine.deadline(), now)

    def _dispatch(self, batch: Batch) -> None:
        self._inflight[batch.id] = batch
        try:
            self._runner.send(batch.id, self._inputs(batch))
        except Exception as e:  # unpicklable inputs, or the worker's socket is gone
            log.warning("batch %d (requests %s) could not be sent: %r", batch.id, batch.ids, e)
            self._inflight.pop(batch.id)
            self._engine.complete(batch.id, self._clock(), compute_s=None)
            self._settle(self._ledger.fail_batch(batch, WorkerDied(
                f"the batch could not be sent to the model worker: {e}")))

    def _inputs(self, batch: Batch) -> Any:
        reqs = self._requests
        if len(batch.parts) == 1:
            p = batch.parts[0]
            r = reqs[p.request_id]
            return [r.items[0]] if r.single else _slice(r.items, p.start, p.stop)
        chunks = [_slice(reqs[p.request_id].items, p.start, p.stop) for p in batch.parts]
        if all(isinstance(c, np.ndarray) for c in chunks):
            return np.concatenate(chunks)
        return [x for c in chunks for x in c]

    def _arm_timer(self, deadline: float | None, now: float) -> None:
        if deadline is None or deadline >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at = deadline
        self._timer = self._loop.call_later(max(deadline - now, 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self._pump()

    # -- results ------------------------------------------------------------------------
    def _on_message(self, msg: tuple) -> None:
        kind, batch_id, payload, compute_s = msg
        batch = self._inflight.pop(batch_id, None)
        if batch is None:
            log.error("result for unknown batch %r dropped", batch_id)
            return
        self._engine.complete(batch_id, self._clock(), compute_s=compute_s)
        if kind == "ok":
            self._settle(self._ledger.deliver(batch, payload))
        else:
            self._settle(self._ledger.fail_batch(batch, payload))
        if not self._pump_scheduled:
            self._pump()

    def _on_worker_exit(self, reason: str) -> None:
        log.error("%s; failing %d open requests", reason, len(self._futures))
        self._state = "closed"
        self._closed_reason = f"{reason}; create a new BatchedService"
        self._abort(WorkerDied(f"{reason} before the request finished"))

    def _abort(self, error: BaseException) -> None:
        for rid in list(self._requests):
            self._engine.cancel(rid, self._clock())
        self._inflight.clear()
        self._settle(self._ledger.fail_all(error))
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, float("inf")
        if self._state == "closing":
            self._state = "closed"

    def _settle(self, outcomes: list[Outcome]) -> None:
        futures, requests = self._futures, self._requests
        for o in outcomes:
            requests.pop(o.request_id, None)
            fut = futures.pop(o.request_id, None)
            if fut is None or fut.done():
                continue
            if o.error is None:
                fut.set_result(o.value)
            else:
                fut.set_exception(o.error)
        if not futures:
            self._idle.set()


def _slice(items: Sequence[Any], start: int, stop: int) -> Any:
    if start == 0 and stop == len(items):
        return items if isinstance(items, np.ndarray) else list(items)
    return items[start:stop]
