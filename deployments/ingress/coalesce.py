"""Coalescing: many concurrent requests, one Ray call; many cancels, one more.

Whatever requests arrive during one event-loop tick go to the batching actor
in bundles of at most `bundle_items` items (one batch's worth; as one stacked array
where it can, `deployments.wire.bundles`), one plain Ray call each (no timer, no added
wait: the flush is scheduled with `call_soon` when the first request of a tick
arrives). Each request carries its deadline, an instant of this node's clock set by the
route, and each bundle its sender's stamp (`deployments.wire.bundles.stamp`), so the time
it takes to reach the actor counts against its requests' deadlines. A bundle's answer
resolves each request's future by its key; a bundle whose call fails (the batching actor
died) fails its requests with `WorkerDied`: nothing accepted is silently dropped.
Bundles of one batch keep the pipeline full: the first batch's answers do not
wait for the next batch's.

A caller that gives up (its task is cancelled: a `RaybatchClient` caller, or
Serve cancelling the ingress handler of an HTTP client that went away) cancels
its future. A request not yet sent is simply left out of its bundle; one already
sent is cancelled at the batching actor, where it never runs if it is still
queued. The cancels of one tick go in one call per actor, like the bundles. A block of
the native front's some of whose clients hung up has their rows withdrawn instead
(`withdraw`: a `deployments.wire.withdraw.Withdraw` among the tick's cancels).
Invariants: a bundle's Ray call is submitted in the same tick as its flush
(not inside a task), so a cancel that follows it is submitted after it and the
actor sees the request before its cancel. Flushes run in a fresh `contextvars`
context (`detached`): Ray takes the parent of a call made in an async actor from
the context (`ray._raylet.async_task_id`), and the flush would otherwise inherit
the first submitter's, so Serve cancelling that one HTTP request would cancel
the whole bundle's call, and every batch-mate in it with `WorkerDied`.

With `batcher.link` (the default) bundles and cancels go on a direct connection to the
batching actor (`deployments.wire.link`) instead of a Ray call each, once it is open: the
first bundles go as Ray calls while it opens, and a cancel goes the way its request did,
so the actor still sees a request before its cancel. A connection that ends fails its
open bundles as a failed Ray call would, with what Ray says of the actor (dead, or
ended on purpose: `BatcherStopped`); the next bundle opens another. Where no connection
can be opened (another version's actor, a network between nodes that allows only Ray's
ports) the bundles go as Ray calls, and opening is tried again a while later. The
connection has a heartbeat (`deployments.wire.keepalive`): one that stops answering ends as one
that closed, once Ray, asked (bounded: `ASK_RAY_S`), does not say the actor lives on:
losing a batching actor fails every request open on it, so a busy or CPU-starved one that
went quiet for `link_dead_s` keeps its connection.

Every request with a deadline is answered by it, whatever the actor, its connection or
Ray do: `hard_timeout(priority, timeout_s)` (the engine's own rule, from the route, on
the time left until its deadline) says when it ends, and `LATE_ANSWER_S` after that (the
actor fails it at its deadline itself, so its own answer normally comes first) one sweep
timer fails it with `NoAnswerInTime` (504) and cancels it at the actor. A heap of
(deadline, key), not a timer per request.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from batching.errors import NoAnswerInTime, WorkerDied
from batching.loop import detached
from deployments.wire.bundles import Entry, outcomes, pack, stamp
from deployments.wire.dialer import Dialer
from deployments.wire.keepalive import DEFAULT, Keepalive
from deployments.wire.link import Link, LinkLost
from deployments.wire.withdraw import Withdraw, key_of

log = logging.getLogger(__name__)
# How Ray 2.60 words an actor ended on purpose (`ray.kill`), as Serve ends a stopped
# version's batching actors once their drain is done (`deployments.ingress.drain`).
_KILLED = "killed by `ray.kill`"
LATE_ANSWER_S = 0.5  # past a request's deadline, its answer is given up on
ASK_RAY_S = 5.0  # after a connection ended, how long Ray may take to say what became of it


async def ask_ray(actor: Any) -> BaseException | None:
    """What Ray says of a batching actor: None if it answers (it lives on), else the error
    its call raised, or `TimeoutError` after `ASK_RAY_S` (bounded: a call to an actor cut
    off from here waits until Ray gives up)."""
    try:
        await asyncio.wait_for(actor.ready.remote(), ASK_RAY_S)
    except asyncio.TimeoutError:
        return TimeoutError(f"Ray had no answer from the batching actor in {ASK_RAY_S:g} s")
    except Exception as e:
        return e
    return None


class BatcherStopped(WorkerDied):
    """The batching actor was ended on purpose (Serve stopping an old version, after its
    drain: a draining actor starts nothing new), so a bundle that had not come back when it
    ended had not been run by it, unless its drain ran out of time (`drain_timeout_s`): a
    caller may send the request again, to the new version, as after `Draining`."""


class Coalescer:
    """Bundles submissions (and cancels) to one batching actor.

    `get_actor` returns the current actor handle; it is asked again after a
    failure, since a recreated actor has a new handle.
    """

    def __init__(self, get_actor: Callable[[], Any], bundle_items: int = 64,
                 on_lost: Callable[[int], None] | None = None, link: bool = True,
                 model: str | None = None, keepalive: Keepalive | None = DEFAULT,
                 hard_timeout: Callable[[Any, float | None], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`hard_timeout(priority, timeout_s)`: the seconds after which the engine no
        longer answers a request but with an error (None: no bound); default: `timeout_s`."""
        self._get_actor = get_actor
        # an actor that runs a group of models: each call names this one's
        self._model = () if model is None else (model,)
        self._bundle_items = bundle_items
        self._on_lost = on_lost  # told how many requests a failed bundle ended (metrics)
        self.caller = uuid.uuid4().hex  # names this coalescer's keys at the actor
        self._calls: set[asyncio.Task] = set()  # referenced, so none is collected mid-flight
        self._actor: Any = None
        self._keys = itertools.count()
        self._pending: list[Entry] = []
        self._futures: dict[int, asyncio.Future] = {}
        self._to_cancel: list[Any] = []  # keys, and `Withdraw`s of a block's rows
        self._blocks: dict[asyncio.Future, int] = {}  # open blocks' futures -> their keys
        self.bundles_sent = 0
        self.cancels_sent = 0
        # the direct connection to the actor (batcher.link), once open
        self._dialer = Dialer("the batching actor", keepalive, ask=ask_ray) if link else None
        self._ray_keys: set[int] = set()  # open requests sent in Ray calls (with a link)
        self.linked_bundles = 0  # bundles sent on the connection
        self._hard = hard_timeout or (lambda priority, timeout_s: timeout_s)
        self._clock = clock
        self._answer_by: list[tuple[float, int]] = []  # heap: (deadline + LATE_ANSWER_S, key)
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self.late = 0  # requests this side gave up on at their deadline

    @property
    def outstanding(self) -> int:
        """Requests sent or about to be sent that have no outcome yet."""
        return len(self._futures)

    def submit(self, items: Any, priority: int | None, deadline: float | None,
               control: Any = None, requests: int = 1) -> asyncio.Future:
        """`deadline`: the `clock()` instant by which the request ends (None: none).
        `control`: a sequence model's (sequence_id, start, end); None for stateless ones.
        `requests`: the clients' requests it stands for (a block), as the engine counts.
        Cancelling the returned future cancels the request."""
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        fut = loop.create_future()
        self._futures[key] = fut
        fut.add_done_callback(lambda f, key=key: f.cancelled() and self._cancelled(key))
        if requests > 1:  # a block: rows of its clients may be withdrawn (`withdraw`)
            self._blocks[fut] = key
            fut.add_done_callback(self._blocks.pop)
        self._pending.append(Entry(key, items, priority, deadline, control, requests))
        if len(self._pending) == 1:
            loop.call_soon(self._flush, context=detached())
        now = self._clock()
        hard_s = self._hard(priority, None if deadline is None else deadline - now)
        if hard_s:
            self._answer_by_deadline(key, now + hard_s + LATE_ANSWER_S)
        return fut

    # -- deadlines: every request answered by its own ---------------------------------------
    def _answer_by_deadline(self, key: int, at: float) -> None:
        heap = self._answer_by
        heapq.heappush(heap, (at, key))
        if len(heap) > 1024 and len(heap) > 4 * len(self._futures):  # mostly answered
            heap[:] = [e for e in heap if e[1] in self._futures]
            heapq.heapify(heap)
        if at < self._sweep_at:
            self._arm_sweep(heap[0][0])

    def _arm_sweep(self, at: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = asyncio.get_running_loop().call_later(
            max(at - self._clock(), 0.0), self._end_overdue, context=detached())

    def _end_overdue(self) -> None:
        self._sweep, self._sweep_at = None, math.inf
        heap, futures = self._answer_by, self._futures
        now = self._clock()
        while heap and (heap[0][0] <= now or heap[0][1] not in futures):
            key = heapq.heappop(heap)[1]
            fut = futures.get(key)
            if fut is None or fut.done():  # answered; or cancelled: its callback cancels it
                continue
            del futures[key]
            self.late += 1
            fut.set_exception(NoAnswerInTime(
                f"no answer from the batching actor by this request's deadline (+"
                f"{LATE_ANSWER_S:g} s): it, or the replica running the request, is slow or "
                "cut off; retry"))
            self._cancel_sent(key)
        if heap:
            self._arm_sweep(heap[0][0])

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        bundle: list[Entry] = []
        items = 0
        futures = self._futures
        for entry in pending:
            fut = futures.get(entry.key)
            if fut is None or fut.cancelled():  # the caller gave up before it was sent
                futures.pop(entry.key, None)
                continue
            n = len(entry.items)
            if bundle and items + n > self._bundle_items:
                self._start(bundle)
                bundle, items = [], 0
            bundle.append(entry)
            items += n
        if bundle:
            self._start(bundle)

    def _start(self, bundle: list[Entry]) -> None:
        self.bundles_sent += 1
        dialer = self._dialer
        link = dialer.live() if dialer is not None else None
        try:
            if self._actor is None:
                self._actor = self._get_actor()
            if link is not None:
                call = link.call(pack(bundle), self.caller, stamp(), *self._model)
                self.linked_bundles += 1
            else:
                # submitted now, in this tick: see the note
                call = self._actor.infer.remote(pack(bundle), self.caller, stamp(),
                                                *self._model)
                if dialer is not None:
                    self._ray_keys.update(entry.key for entry in bundle)
                    actor = self._actor
                    dialer.dial(actor, lambda: self._actor is actor)
        except Exception as e:
            self._lost(bundle, e)
            return
        task = asyncio.get_running_loop().create_task(self._answer(bundle, call, link))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, bundle: list[Entry], call: Any, link: Link | None) -> None:
        try:
            for o in outcomes(await call):
                fut = self._futures.pop(o.key, None)
                if fut is None or fut.done():
                    continue
                if o.error is None:
                    fut.set_result(o.value)
                else:
                    fut.set_exception(o.error)
        except LinkLost as e:
            await self._link_lost(bundle, e, link)
        except Exception as e:
            self._lost(bundle, e)
        finally:
            if link is None and self._ray_keys:
                self._ray_keys.difference_update(entry.key for entry in bundle)
            self._fail(bundle, WorkerDied("the batching actor answered without an outcome "
                                          "for this request"))

    # -- the direct connection (deployments.wire.link) -----------------------------------------
    async def _link_lost(self, bundle: list[Entry], e: LinkLost, link: Link | None) -> None:
        """The connection ended with `bundle` open: fail it with what Ray says of the actor
        (dead, or ended on purpose), or with `e` if the actor lives on."""
        if self._dialer is not None and link is not None:
            self._dialer.drop(link)
        said = e.ray_said  # asked already, before the connection was taken for lost
        if said is None and self._actor is not None:
            said = await ask_ray(self._actor)
        self._lost(bundle, e if said is None or isinstance(said, TimeoutError) else said)

    def _lost(self, bundle: list[Entry], e: BaseException) -> None:
        self._actor = None
        log.error("bundle of %d requests lost its batching actor: %r", len(bundle), e)
        died = BatcherStopped if _KILLED in str(e) else WorkerDied
        self._fail(bundle, died(f"the batching actor failed: {type(e).__name__}: {e}"))

    def _fail(self, bundle: list[Entry], error: BaseException) -> None:
        failed = 0
        for key, *_ in bundle:
            fut = self._futures.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_exception(error)
                failed += 1
        if failed and self._on_lost is not None:
            self._on_lost(failed)

    # -- cancels ------------------------------------------------------------------------
    def _cancelled(self, key: int) -> None:
        """The caller gave up on request `key` (its future was cancelled)."""
        # Done callbacks run after the flush that was due when the future was made (both
        # go through call_soon, in order), so a key still here was sent.
        if self._futures.pop(key, None) is None:
            return  # it had ended already, or _flush left it out
        self._cancel_sent(key)

    def _cancel_sent(self, key: int) -> None:
        """Cancel request `key` at the actor (with the others of this tick)."""
        self._to_cancel.append(key)
        if len(self._to_cancel) == 1:
            asyncio.get_running_loop().call_soon(self._flush_cancels, context=detached())

    def withdraw(self, fut: asyncio.Future, rows: Any) -> bool:
        """Withdraw the rows `rows` (indices into its items) of the block whose future is
        `fut` at the actor, those it still holds queued (`deployments.wire.withdraw`); its
        answer then says which rows it carries (`batching.types.Rows`). False if `fut` is
        no open block of this coalescer."""
        key = self._blocks.get(fut)
        if key is None or fut.done():
            return False
        message = Withdraw(key, tuple(int(r) for r in rows))
        # after the flush that sends the block (due since its submit: see `_cancelled`)
        asyncio.get_running_loop().call_soon(self._withdraw_sent, message, context=detached())
        return True

    def _withdraw_sent(self, message: Withdraw) -> None:
        if message.key in self._futures:  # still open (and so sent)
            self._cancel_sent(message)

    def _flush_cancels(self) -> None:
        keys, self._to_cancel = self._to_cancel, []
        if self._actor is None:
            return  # the actor that had them is gone, and their requests with it
        self.cancels_sent += 1
        link = self._dialer.live() if self._dialer is not None else None
        if link is not None:  # each goes the way its request went
            ray_keys = self._ray_keys
            by_ray = [k for k in keys if key_of(k) in ray_keys] if ray_keys else []
            if len(by_ray) < len(keys):
                link.cancel(self.caller, [k for k in keys if key_of(k) not in ray_keys]
                            if by_ray else keys, *self._model)
            if not by_ray:
                return
            keys = by_ray
        try:
            call = self._actor.cancel.remote(self.caller, keys, *self._model)
        except Exception as e:
            log.warning("cancelling %d requests failed: %r", len(keys), e)
            return
        task = asyncio.get_running_loop().create_task(_report_cancel(call, len(keys)))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)


async def _report_cancel(call: Any, n: int) -> None:
    """Await a cancel call so its errors are seen: the requests still end at the actor
    (their answers are dropped here), so a failed cancel costs compute, not correctness."""
    try:
        await call
    except Exception as e:
        log.warning("cancelling %d requests at the batching actor failed: %r", n, e)
