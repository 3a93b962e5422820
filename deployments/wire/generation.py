"""Generation streams between the ingress and a generative model's batching actor.

A stream per generation over Ray would cost one Ray object per token per
client, and those cost more than a small model's step. So streams
are multiplexed, as bundles are for `infer`: each ingress replica (a
`GenerateMux`) starts the generations of one loop tick in one call, and keeps
ONE long poll open per batching actor that returns every new event of all its
generations at once, so a step of 32 sequences costs one round trip, not 32.
Cancelling (the HTTP client went away) is one more call, also coalesced; its
errors are logged. Like bundles (`deployments.ingress.coalesce`), these calls are made
in a detached context: made in one stream's context, they would be Ray children
of that stream's request, and Serve cancelling it would cancel every stream's poll.

The actor side (`StreamHub`) buffers each caller's events until it polls. A
caller that stops polling for `lease_s` (its ingress died) has its
generations cancelled, so nothing generates for nobody.

Time, as for bundles (`deployments.wire.bundles`): a generation's timeout (to start
generating) becomes one deadline where the stream is asked for, an instant of the
caller's monotonic clock; the start call carries the caller's stamp and the actor reads
each deadline on its own clock once, on arrival (`Arrival`), so the time the start spent
on its way (the tick, the Ray call, an actor's loop busy elsewhere) counts against it. A
generation whose deadline passed on the way is refused as overloaded (429), nothing of it
run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from batching.errors import InvalidRequest, RaybatchError, WorkerDied, portable
from batching.iterative.host import Finished, IterativeHost
from batching.iterative.sampling import check_sampling
from batching.iterative.scheduler import GenerateRequest
from batching.loop import detached, detached_task
from deployments.protocol.binary import is_seconds, is_uint
from deployments.wire.bundles import Arrival, Stamp, stamp, time_left

log = logging.getLogger(__name__)
GENERATE_PARAMETERS = ("max_tokens", "stop", "priority", "timeout", "timeout_s", "temperature",
                       "top_p", "seed")
LEASE_S = 30.0
POLL_WAIT_S = 5.0


def generate_request(request_id: Any, prompt: Any,
                     params: dict[str, Any] | None) -> GenerateRequest:
    """A checked `GenerateRequest` from the OIP generate body's `text_input` and
    `parameters` (`timeout` in microseconds, as for infer; `timeout_s` from Python;
    `temperature` 0..2, 0 greedy, `top_p` in (0, 1] and `seed` as OpenAI's, checked by
    `batching.iterative.sampling.check_sampling`)."""
    if not isinstance(prompt, str):
        raise InvalidRequest(f"'text_input' must be a string, got {type(prompt).__name__}")
    params = params or {}
    if not isinstance(params, dict):
        raise InvalidRequest(f"'parameters' must be an object, got {params!r}")
    unknown = sorted(set(params) - set(GENERATE_PARAMETERS))
    if unknown:
        raise InvalidRequest(f"unknown generate parameter(s) {unknown}: generate takes "
                             f"{list(GENERATE_PARAMETERS)}")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise InvalidRequest(f"parameter 'max_tokens' must be an integer, got {max_tokens!r}")
    stop = params.get("stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise InvalidRequest(f"parameter 'stop' must be a non-empty string or a list of them, "
                             f"got {stop!r}")
    priority = params.get("priority")
    if priority is not None and not is_uint(priority):
        raise InvalidRequest(f"parameter 'priority' must be a non-negative integer, "
                             f"got {priority!r}")
    timeout_s = params.get("timeout_s")
    if timeout_s is not None and not is_seconds(timeout_s):
        raise InvalidRequest(f"parameter 'timeout_s' must be a non-negative number of "
                             f"seconds, got {timeout_s!r}")
    if "timeout" in params:
        us = params["timeout"]
        if not is_uint(us) or us >= 2**64:  # the wire's uint64; past it, no float holds it
            raise InvalidRequest(f"parameter 'timeout' must be a non-negative integer in "
                                 f"microseconds, below 2**64, got {us!r}")
        timeout_s = us / 1e6 if us else None
    temperature, top_p, seed = check_sampling(params.get("temperature"), params.get("top_p"),
                                              params.get("seed"))
    return GenerateRequest(request_id, prompt, max_tokens, tuple(stop), priority or None,
                           timeout_s, temperature=temperature, top_p=top_p, seed=seed)


def event_json(event: Any) -> dict[str, Any]:
    """A host event as the protocol's JSON: text per step, then a final one."""
    if isinstance(event, Finished):
        return {"text_output": "", "final": True, "finish_reason": event.finish_reason,
                "num_tokens": event.num_tokens, "prompt_tokens": event.prompt_tokens}
    return {"text_output": event.text, "index": event.index}


# -- the actor side ------------------------------------------------------------------------
class _Caller:
    __slots__ = ("events", "polled_s", "ready", "streams")

    def __init__(self) -> None:
        self.events: dict[Any, list] = {}  # key -> events (dicts, or an exception last)
        self.ready = asyncio.Event()
        self.polled_s = time.monotonic()
        self.streams: dict[Any, Any] = {}  # key -> host request id


class StreamHub:
    def __init__(self, host: IterativeHost, ids: Callable[[], int], lease_s: float = LEASE_S):
        self.host = host
        self._ids = ids
        self.lease_s = lease_s
        self._callers: dict[str, _Caller] = {}
        self._tasks: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None

    def start(self, caller: str, entries: list[tuple], sent: Stamp | None = None
              ) -> list[tuple[Any, Any]]:
        """Start generations, each `(key, prompt, params[, deadline])` (the deadline on
        the clock of `sent`, the caller's stamp); returns (key, error) of those refused
        at once."""
        c = self._callers.setdefault(caller, _Caller())
        refused = []
        arrival = Arrival(sent)
        for key, prompt, params, *deadline in entries:
            rid = self._ids()
            try:
                request = generate_request(rid, prompt, params)
                if deadline and deadline[0] is not None:
                    left = time_left(arrival.instant(deadline[0]), arrival.now)
                    request = dataclasses.replace(request, timeout_s=left)
                stream = self.host.submit(request)
            except RaybatchError as e:
                refused.append((key, e))
                continue
            c.streams[key] = rid
            task = asyncio.get_running_loop().create_task(self._pump(c, key, stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._reaper is None:
            self._reaper = detached_task(self._reap())
        return refused

    async def _pump(self, c: _Caller, key: Any, stream: Any) -> None:
        try:
            async for event in stream:
                c.events.setdefault(key, []).append(event_json(event))
                c.ready.set()
        except Exception as e:
            error = e if isinstance(e, RaybatchError) else portable(e)
            c.events.setdefault(key, []).append(error)
            c.ready.set()
        finally:
            c.streams.pop(key, None)

    async def poll(self, caller: str, wait_s: float = POLL_WAIT_S) -> list[tuple[Any, list]]:
        """Every event of `caller`'s generations since its last poll; waits up to `wait_s`
        for the first one."""
        c = self._callers.setdefault(caller, _Caller())
        c.polled_s = time.monotonic()
        if not c.events:
            c.ready.clear()
            try:
                await asyncio.wait_for(c.ready.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        out, c.events = list(c.events.items()), {}
        c.polled_s = time.monotonic()
        return out

    def cancel(self, caller: str, keys: list[Any]) -> None:
        c = self._callers.get(caller)
        for key in keys:
            rid = c.streams.get(key) if c else None
            if rid is not None:
                self.host.cancel(rid, "cancelled: its client went away")

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            now = time.monotonic()
            for name, c in list(self._callers.items()):
                if now - c.polled_s > self.lease_s:
                    log.warning("caller %s stopped polling: cancelling its %d generations",
                                name, len(c.streams))
                    self.cancel(name, list(c.streams))
                    del self._callers[name]


# -- the caller side -----------------------------------------------------------------------
class GenerateMux:
    """The ingress's end: many generation streams over one poll per batching actor."""

    def __init__(self, get_actor: Callable[[], Any]) -> None:
        self._get_actor = get_actor
        self.caller = uuid.uuid4().hex
        self._keys = itertools.count()
        self._queues: dict[int, asyncio.Queue] = {}
        self._to_start: list[tuple] = []
        self._to_cancel: list[int] = []
        self._poller: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def outstanding(self) -> int:
        return len(self._queues)

    async def stream(self, prompt: str, params: dict[str, Any]) -> AsyncIterator[dict]:
        """The generation's events (dicts); raises its error. Closing early cancels it."""
        # a bad request fails here, before any Ray call; its timeout is a deadline from now
        timeout_s = generate_request(0, prompt, params).timeout_s
        deadline = time.monotonic() + timeout_s if timeout_s else None
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[key] = queue
        self._to_start.append((key, prompt, params, deadline))
        if len(self._to_start) == 1:
            loop.call_soon(self._flush_starts, context=detached())
        final = False
        try:
            while not final:
                event = await queue.get()
                if isinstance(event, BaseException):
                    final = True
                    raise event
                final = bool(event.get("final"))
                yield event
        finally:
            self._queues.pop(key, None)
            if not final:
                self._cancel(key)

    def _spawn(self, coro: Any) -> None:
        task = detached_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush_starts(self) -> None:
        entries, self._to_start = self._to_start, []
        self._spawn(self._start(entries))
        if self._poller is None or self._poller.done():
            self._poller = detached_task(self._poll())

    async def _start(self, entries: list[tuple]) -> None:
        try:
            refused = await self._get_actor().start_generations.remote(self.caller, entries,
                                                                       stamp())
        except Exception as e:
            refused = [(key, WorkerDied(f"the batching actor failed: {type(e).__name__}: {e}"))
                       for key, *_ in entries]
        for key, error in refused:
            self._deliver(key, [error])

    def _cancel(self, key: int) -> None:
        self._to_cancel.append(key)
        if len(self._to_cancel) == 1:
            asyncio.get_running_loop().call_soon(self._flush_cancels, context=detached())

    def _flush_cancels(self) -> None:
        keys, self._to_cancel = self._to_cancel, []
        self._spawn(self._send_cancels(keys))

    async def _send_cancels(self, keys: list[int]) -> None:
        """One call for the tick's cancels; a failure is logged (the generations then
        run to their end at the actor, for nobody, or stop with its lease)."""
        try:
            await self._get_actor().cancel_generations.remote(self.caller, keys)
        except Exception as e:
            log.warning("cancelling %d generations at the batching actor failed: %r",
                        len(keys), e)

    async def _poll(self) -> None:
        while self._queues:
            try:
                batch = await self._get_actor().poll_generations.remote(self.caller)
            except Exception as e:
                log.error("polling generations failed: %r", e)
                for key in list(self._queues):
                    self._deliver(key, [WorkerDied(f"the batching actor failed: {e}")])
                return
            for key, events in batch:
                self._deliver(key, events)

    def _deliver(self, key: int, events: list) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            for event in events:
                queue.put_nowait(event)


async def collect(events: AsyncIterator[dict]) -> dict[str, Any]:
    """A whole generation as one response: the text, why it ended, token counts."""
    text: list[str] = []
    async for event in events:
        if event.get("final"):
            return {**event, "text_output": "".join(text), "final": True}
        text.append(event["text_output"])
    raise WorkerDied("the generation ended without its final event")
