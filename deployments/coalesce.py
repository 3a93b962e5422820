"""Coalescing: many concurrent requests, one Ray call; many cancels, one more.

Whatever requests arrive during one event-loop tick go to the batching actor
in bundles of at most `bundle_items` items (one batch's worth; as one stacked array
where it can, `deployments.bundles`), one plain Ray call each (no timer, no added
wait: the flush is scheduled with `call_soon` when the first request of a tick
arrives). Each bundle carries when it left (`deployments.transit`): the time it takes to reach
the actor counts against its requests' timeouts. A bundle's answer resolves each
request's future by its key; a bundle whose call fails (the batching actor
died) fails its requests with `WorkerDied`: nothing accepted is silently dropped.
Bundles of one batch keep the pipeline full: the first batch's answers do not
wait for the next batch's.

A caller that gives up (its task is cancelled: a `RaybatchClient` caller, or
Serve cancelling the ingress handler of an HTTP client that went away) cancels
its future. A request not yet sent is simply left out of its bundle; one already
sent is cancelled at the batching actor, where it never runs if it is still
queued. The cancels of one tick go in one call per actor, like the bundles.
Invariants: a bundle's Ray call is submitted in the same tick as its flush
(not inside a task), so a cancel that follows it is submitted after it and the
actor sees the request before its cancel. Flushes run in a fresh `contextvars`
context (`detached`): Ray takes the parent of a call made in an async actor from
the context (`ray._raylet.async_task_id`), and the flush would otherwise inherit
the first submitter's, so Serve cancelling that one HTTP request would cancel
the whole bundle's call, and every batch-mate in it with `WorkerDied`.

With `batcher.link` (the default) bundles and cancels go on a direct connection to the
batching actor (`deployments.link`) instead of a Ray call each, once it is open: the
first bundles go as Ray calls while it opens, and a cancel goes the way its request did,
so the actor still sees a request before its cancel. A connection that ends fails its
open bundles as a failed Ray call would, with what Ray says of the actor (dead, or
ended on purpose: `BatcherStopped`); the next bundle opens another. Where no connection
can be opened (another version's actor, a network between nodes that allows only Ray's
ports) the bundles go as Ray calls, and opening is tried again a while later.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from batching.errors import WorkerDied
from batching.loop import detached
from deployments.bundles import outcomes, pack
from deployments.link import Dialer, Link, LinkLost
from deployments.transit import stamp

log = logging.getLogger(__name__)
# How Ray 2.60 words an actor ended on purpose (`ray.kill`), as Serve ends a stopped
# version's batching actors once their drain is done (`deployments.drain`).
_KILLED = "killed by `ray.kill`"


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
                 model: str | None = None) -> None:
        self._get_actor = get_actor
        # an actor that runs a group of models: each call names this one's
        self._model = () if model is None else (model,)
        self._bundle_items = bundle_items
        self._on_lost = on_lost  # told how many requests a failed bundle ended (metrics)
        self.caller = uuid.uuid4().hex  # names this coalescer's keys at the actor
        self._calls: set[asyncio.Task] = set()  # referenced, so none is collected mid-flight
        self._actor: Any = None
        self._keys = itertools.count()
        self._pending: list[tuple] = []
        self._futures: dict[int, asyncio.Future] = {}
        self._to_cancel: list[int] = []
        self.bundles_sent = 0
        self.cancels_sent = 0
        # the direct connection to the actor (batcher.link), once open
        self._dialer = Dialer("the batching actor") if link else None
        self._ray_keys: set[int] = set()  # open requests sent in Ray calls (with a link)
        self.linked_bundles = 0  # bundles sent on the connection

    @property
    def outstanding(self) -> int:
        """Requests sent or about to be sent that have no outcome yet."""
        return len(self._futures)

    def submit(self, items: Any, priority: int | None, timeout_s: float | None,
               control: Any = None, requests: int = 1) -> asyncio.Future:
        """`control`: a sequence model's (sequence_id, start, end); None for stateless ones.
        `requests`: the clients' requests it stands for (a block), as the engine counts.
        Cancelling the returned future cancels the request."""
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        fut = loop.create_future()
        self._futures[key] = fut
        fut.add_done_callback(lambda f, key=key: f.cancelled() and self._cancelled(key))
        self._pending.append((key, items, priority, timeout_s, control) if requests == 1
                             else (key, items, priority, timeout_s, control, requests))
        if len(self._pending) == 1:
            loop.call_soon(self._flush, context=detached())
        return fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        bundle: list[tuple] = []
        items = 0
        futures = self._futures
        for entry in pending:
            fut = futures.get(entry[0])
            if fut is None or fut.cancelled():  # the caller gave up before it was sent
                futures.pop(entry[0], None)
                continue
            n = len(entry[1])
            if bundle and items + n > self._bundle_items:
                self._start(bundle)
                bundle, items = [], 0
            bundle.append(entry)
            items += n
        if bundle:
            self._start(bundle)

    def _start(self, bundle: list[tuple]) -> None:
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
                    self._ray_keys.update(entry[0] for entry in bundle)
                    actor = self._actor
                    dialer.dial(actor, lambda: self._actor is actor)
        except Exception as e:
            self._lost(bundle, e)
            return
        task = asyncio.get_running_loop().create_task(self._answer(bundle, call, link))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, bundle: list[tuple], call: Any, link: Link | None) -> None:
        try:
            for key, value, error in outcomes(await call):
                fut = self._futures.pop(key, None)
                if fut is None or fut.done():
                    continue
                if error is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(error)
        except LinkLost as e:
            await self._link_lost(bundle, e, link)
        except Exception as e:
            self._lost(bundle, e)
        finally:
            if link is None and self._ray_keys:
                self._ray_keys.difference_update(entry[0] for entry in bundle)
            self._fail(bundle, WorkerDied("the batching actor answered without an outcome "
                                          "for this request"))

    # -- the direct connection (deployments.link) -----------------------------------------
    async def _link_lost(self, bundle: list[tuple], e: LinkLost, link: Link | None) -> None:
        """The connection ended with `bundle` open: fail it with what Ray says of the actor
        (dead, or ended on purpose), or with `e` if the actor lives on."""
        if self._dialer is not None and link is not None:
            self._dialer.drop(link)
        actor = self._actor
        try:
            if actor is not None:
                await actor.ready.remote()
        except Exception as died:
            self._lost(bundle, died)
            return
        self._lost(bundle, e)

    def _lost(self, bundle: list[tuple], e: BaseException) -> None:
        self._actor = None
        log.error("bundle of %d requests lost its batching actor: %r", len(bundle), e)
        died = BatcherStopped if _KILLED in str(e) else WorkerDied
        self._fail(bundle, died(f"the batching actor failed: {type(e).__name__}: {e}"))

    def _fail(self, bundle: list[tuple], error: BaseException) -> None:
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
        self._to_cancel.append(key)
        if len(self._to_cancel) == 1:
            asyncio.get_running_loop().call_soon(self._flush_cancels, context=detached())

    def _flush_cancels(self) -> None:
        keys, self._to_cancel = self._to_cancel, []
        if self._actor is None:
            return  # the actor that had them is gone, and their requests with it
        self.cancels_sent += 1
        link = self._dialer.live() if self._dialer is not None else None
        if link is not None:  # each goes the way its request went
            by_ray = [k for k in keys if k in self._ray_keys] if self._ray_keys else []
            if len(by_ray) < len(keys):
                link.cancel(self.caller, [k for k in keys if k not in self._ray_keys]
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
