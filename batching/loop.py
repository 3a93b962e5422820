"""`LoopHost`: the event-loop scaffolding that `BatchHost`, `SequenceHost` and
`IterativeHost` share; each keeps its own policy (its `_pump`, submit, dispatch
and outcomes).

It decides when a host's pump runs: at most once per loop tick, so every submit,
cancel and completion of one tick is handled together at no added wait, and when
the engine's `deadline()` comes, through one timer, moved only to an earlier
deadline. It also decides how a host closes: refuse new requests, drain the engine,
run what is open for up to a timeout, then `abort` the rest. The three hosts differ
in policy, not in this, so it is written once.

Invariants: at most one pump is scheduled and one timer armed (`_timer_at` is its
deadline, inf when none); every task a host starts stays referenced in `_tasks`
until it ends, so none is collected mid-flight. What a batch sends is captured when
the pump forms it (`Dispatched.inputs`), never read back from the open requests
later: a request cancelled between forming and sending (or before a retry) ends
alone, and its batch-mates still run on exactly the inputs they were formed with.

A batch (or step) is nobody's: the pump, its timer and every task a host starts run
in an empty `contextvars` context (`detached`), never in the context of the submit
that happened to schedule them. A task copies its creator's context, and a caller's
context may say whose work it is: in a Ray actor, `ray._raylet.async_task_id` makes
every Ray call of a task a child of the request that created it, so Serve cancelling
that one request (its HTTP client hung up) would cancel the batch's call to the
replica, and fail every batch-mate in it.
The clock is injected (`clock`); never imports Ray.
"""

from __future__ import annotations

import asyncio
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from batching.errors import ServiceClosed


def detached() -> contextvars.Context:
    """An empty context, for work done on behalf of many requests: nothing of the
    caller who happened to start it (see the note) travels with it."""
    return contextvars.Context()


def detached_task(coro: Coroutine[Any, Any, Any],
                  loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task:
    """`coro` as a task that runs in a `detached` context (`create_task(context=...)`
    needs Python 3.11; running `create_task` inside the context works from 3.10)."""
    loop = loop or asyncio.get_running_loop()
    return detached().run(loop.create_task, coro)


class ReplicaDied(Exception):
    """Raised by a ReplicaClient when the replica is gone (the batch may be retried)."""


class ReplicaHung(ReplicaDied):
    """Raised by a ReplicaClient for the batch that ran past its time limit, after it
    stopped the replica: the replica is gone (its other batches are retried), but this
    batch is not retried (it would likely hang again): its requests fail with `error`."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


class OpenRequest:
    """An open request: its future, what was asked, and when (for statistics); by when it
    must end (`deadline_s`, inf: no bound), where its host keeps that."""

    __slots__ = ("deadline_s", "future", "request", "submitted_s")

    def __init__(self, future: asyncio.Future, request: Any, submitted_s: float,
                 deadline_s: float = float("inf")) -> None:
        self.future = future
        self.request = request
        self.submitted_s = submitted_s
        self.deadline_s = deadline_s


class ReplicaSlot:
    """A replica client and its batches in flight (also the engine's key for it)."""

    __slots__ = ("client", "inflight")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.inflight = 0


class Dispatched:
    """A batch the pump formed, with the inputs it sends (captured then: see the note at
    the top), whether it was already retried after its replica died, whether it waits for
    a replica to run it again (`parked`), and the latest deadline of its requests
    (`deadline_s`, inf if one has none): its wait for an answer ends then."""

    __slots__ = ("batch", "deadline_s", "inputs", "parked", "retried")

    def __init__(self, batch: Any, inputs: Any, deadline_s: float = float("inf")) -> None:
        self.batch = batch
        self.inputs = inputs
        self.retried = False
        self.parked = False
        self.deadline_s = deadline_s


class Drainable(Protocol):
    def drain(self) -> None:
        """Stop waiting for fuller batches: form what is queued as soon as it can run."""
        ...


E = TypeVar("E", bound=Drainable)


class LoopHost(ABC, Generic[E]):
    """The pump, timer, task set, idle event and close of an asyncio host over `engine`.

    A subclass sets `self.engine`, implements `_pump` (clear `_pump_scheduled`, form and
    send what the engine allows now, then `_arm_timer(engine.deadline(), now)`) and
    `abort`, clears `_idle` when a request opens and sets it when none is open.
    """

    engine: E

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task] = set()
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._idle = asyncio.Event()  # set while no request is open
        self._idle.set()
        self.closed_reason: str | None = None
        self._slots: list[Any] = []  # one per replica: its `client` and what it has in flight

    @property
    def replicas(self) -> list[Any]:
        """The replica clients, in the order they were added."""
        return [s.client for s in self._slots]

    def _slot_of(self, client: Any) -> Any:
        """`client`'s slot, or None once it was removed."""
        return next((s for s in self._slots if s.client is client), None)

    @abstractmethod
    def _pump(self) -> None:
        """Form and send what the engine allows now; the only place work is formed."""

    @abstractmethod
    def abort(self, error: BaseException) -> None:
        """Fail every open request with `error` now."""

    # What a replica pool scales on, in each engine's own unit of waiting work.
    @property
    @abstractmethod
    def queued_work(self) -> int:
        """Work waiting for a replica: items (dynamic) or requests (sequence, iterative)."""

    @property
    @abstractmethod
    def busy(self) -> bool:
        """Whether anything is queued, running or holding state on a replica."""

    @property
    def wait_refusals(self) -> int:
        """Requests refused so far because the engine's wait bound was reached (0 where
        the engine has none): more demand than the replicas serve within it."""
        return 0

    @abstractmethod
    def outstanding(self, client: Any) -> int:
        """Batches (or steps) sent to `client` that have not come back."""

    async def close(self, timeout_s: float, reason: str = "the service is closing") -> None:
        """Refuse new requests, run what is open (the engine drains: no waiting for fuller
        batches) for up to `timeout_s`, then fail what is left with ServiceClosed."""
        if self.closed_reason is None:
            self.closed_reason = reason
        self.engine.drain()
        self._pump()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        self.abort(ServiceClosed(f"{reason}: the request did not finish within the "
                                 f"{timeout_s} s drain timeout"))

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump, context=detached())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Start `coro` as a task, referenced until it ends (the loop holds tasks weakly)."""
        task = detached_task(coro, self._loop)  # nobody's child (see the note)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _arm_timer(self, deadline: float | None, now: float) -> None:
        if deadline is None or deadline >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_later(max(deadline - now, 0.0), self._on_timer,
                                           context=detached())

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self._pump()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, float("inf")
