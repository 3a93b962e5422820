"""`IterativeHost`: the asyncio shell that runs an `IterativeScheduler` against replicas.

Each replica is a `StepReplicaClient` (`async step(join, leave) -> (outputs,
compute_s)`), a Ray actor wrapping a `Generator` or a `LocalStepClient` in
process. The host alone reads the clock, arms the one timer at the scheduler's
`deadline()`, and turns step outputs into per-request streams of `TokenEvent`s
ending with `Finished` (or the request's error: a sequence the replica failed
alone, `StepOutput.error`, ends with that error and the others go on).

One step in flight per replica (a step needs the previous one's output); steps
of different replicas run concurrently. Every event-loop tick runs the pump
once: whatever was submitted, cancelled or completed in that tick is scheduled
together, at no added wait. A replica that dies (`ReplicaDied`) is removed: its
sequences that streamed text fail with `WorkerDied` (nothing partial is
retried); one that streamed nothing yet is requeued once, at the head of its
level, since its caller cannot tell (greedy or seeded decoding gives the same text;
an unseeded sampled one draws afresh, which nobody saw).
A request ends exactly once: `_open` is popped before its end is delivered.
Metrics: a `StepMeter` hands the `recorder` one value per step; `snapshot()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from batching.errors import BatchSizeMismatch, Cancelled, InvalidRequest, ServiceClosed, WorkerDied
from batching.iterative.generative import Generator
from batching.iterative.meter import StepMeter
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest, IterativeScheduler, Join, Step, StepOutput
from batching.loop import LoopHost, ReplicaDied
from batching.metrics import NULL_RECORDER, HostSnapshot, Recorder
from batching.types import RequestId

log = logging.getLogger(__name__)
DIED = "the replica generating this request died; nothing partial is retried"


class StepReplicaClient(Protocol):
    name: str

    async def step(self, join: list[Join],
                   leave: list[RequestId]) -> tuple[list[StepOutput], float]:
        """Run one step; returns (outputs, compute seconds). Raises the model's error, or
        `batching.loop.ReplicaDied` when the replica itself is gone."""
        ...


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New text of one generation (one per step that released text); `index` 0, 1, 2..."""

    id: RequestId
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a generation: `text` is the whole generated text."""

    id: RequestId
    text: str
    finish_reason: str  # "length" | "stop" | "eos"
    num_tokens: int  # tokens generated (eos and a cut stop string included)
    prompt_tokens: int


class GenerationStream:
    """Async iterator of a generation's `TokenEvent`s, then its `Finished`; raises the
    request's error instead (DeadlineExceeded, Cancelled, WorkerDied, the model's).

    >>> # async for event in host.submit(GenerateRequest("a", "Hello")): print(event)
    """

    def __init__(self, host: IterativeHost, request_id: RequestId) -> None:
        self.id = request_id
        self._host = host
        self._events: deque[Any] = deque()  # events, then Finished or an exception
        self._waiter: asyncio.Future | None = None  # __anext__ waits for the next item
        self._end_waiter: asyncio.Future | None = None  # result() waits for the last one
        self._ended = False  # the host delivered the last item
        self._closed = False  # the consumer took the last item, or closed the stream
        self._finished: Finished | None = None

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> TokenEvent | Finished:
        while not self._events:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._events.popleft()
        if isinstance(item, BaseException):
            self._closed = True
            raise item
        if isinstance(item, Finished):
            self._closed, self._finished = True, item
        return item

    async def aclose(self) -> None:
        """Stop reading; a generation not yet ended is cancelled (its slot frees next step)."""
        if not self._ended:
            self._host.cancel(self.id, "closed by its consumer")
        self._closed = True
        self._events.clear()
        self._wake()

    async def result(self) -> Finished:
        """Consume every event; the `Finished` one (or raise the request's error). Waits
        for the end once, not once per event."""
        if not self._ended and not self._closed:
            self._end_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._end_waiter
            finally:
                self._end_waiter = None
        async for _ in self:  # everything is here: no more waiting
            pass
        if self._finished is None:
            raise Cancelled(f"request {self.id!r}: its stream was closed before it finished")
        return self._finished

    # -- the host's side ------------------------------------------------------------------
    def _push(self, item: Any, last: bool = False) -> None:
        self._ended = self._ended or last
        if not self._closed:
            self._events.append(item)
            self._wake(last)

    def _wake(self, last: bool = True) -> None:
        for waiter in (self._waiter, self._end_waiter if last else None):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class _Gen:
    """An open generation: its stream, what was asked, and what it produced so far."""

    __slots__ = ("events", "num_tokens", "parts", "request", "stream", "submitted_s")

    def __init__(self, stream: GenerationStream, request: GenerateRequest, now: float) -> None:
        self.stream, self.request, self.submitted_s = stream, request, now
        self.parts: list[str] = []
        self.events = 0
        self.num_tokens = 0


class _Slot:
    """A replica: the scheduler's key for it (hashed by identity)."""

    __slots__ = ("busy", "client", "removed")

    def __init__(self, client: StepReplicaClient) -> None:
        self.client, self.busy, self.removed = client, False, False


class IterativeHost(LoopHost[IterativeScheduler]):
    """Streams generations of a pool of step replicas under an `IterativePolicy`.

    `count_tokens` counts a prompt's tokens for the step budget (the model's
    `StepModel.count_tokens`, without loading it). Statistics: the scheduler's, plus
    `completed`, `failed` (ended with an error, cancellations included), `waiting`, `active`.

    >>> # host = IterativeHost(IterativePolicy(max_active=32), count_tokens=TinyLM.count_tokens)
    >>> # host.add_replica(LocalStepClient(Generator(model)))
    >>> # finished = await host.submit(GenerateRequest("a", "Once upon", 16)).result()
    """

    def __init__(self, policy: IterativePolicy, *, count_tokens: Callable[[str], int] = len,
                 clock: Callable[[], float] = time.monotonic,
                 on_replica_died: Callable[[StepReplicaClient], None] | None = None,
                 recorder: Recorder = NULL_RECORDER) -> None:
        super().__init__(clock)
        self.policy = policy
        self.meter = StepMeter(recorder, policy.level_of)
        self.engine = IterativeScheduler(policy)
        self._count_tokens = count_tokens
        self._on_replica_died = on_replica_died or (lambda client: None)
        self._open: dict[RequestId, _Gen] = {}
        # Every request ends once: completed, failed (an error) or cancelled (its client's
        # cancel or hang-up), so the three add up to the requests that ended.
        self._counts = {"replica_deaths": 0, "completed": 0, "failed": 0, "cancelled": 0,
                        "compute_s": 0.0,
                        "first_text_s": 0.0, "first_texts": 0}

    # -- replicas -------------------------------------------------------------------------
    _slots: list[_Slot]

    def add_replica(self, client: StepReplicaClient) -> None:
        slot = _Slot(client)
        self._slots.append(slot)
        self.engine.add_replica(slot)
        self._schedule_pump()

    def remove_replica(self, client: StepReplicaClient,
                       why: str = "the replica generating this request was removed") -> None:
        """Stop using `client`: its sequences fail with WorkerDied (`why`), except those
        that streamed nothing yet, which are requeued once; a late answer is ignored."""
        slot = self._slot_of(client)
        if slot is None:
            return
        slot.removed = True
        self._slots.remove(slot)
        self.meter.forget(slot)
        for rid in self.engine.remove_replica(slot):
            self._end(rid, WorkerDied(why))
        self._schedule_pump()

    def outstanding(self, client: StepReplicaClient) -> int:
        """1 while a step of `client` is in flight (one step at a time per replica)."""
        return int(any(s.busy for s in self._slots if s.client is client))

    @property
    def queued_work(self) -> int:
        return self.engine.waiting

    @property
    def open_requests(self) -> int:
        """Requests submitted that have no outcome yet."""
        return len(self._open)

    @property
    def busy(self) -> bool:
        return bool(self.engine.waiting or self.engine.active)

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: GenerateRequest) -> GenerationStream:
        """Queue `request`; its stream. Raises InvalidRequest, QueueFull or ServiceClosed
        at once, keeping nothing."""
        if self.closed_reason is not None:
            raise ServiceClosed(self.closed_reason)
        if request.id in self._open:
            raise InvalidRequest(f"request id {request.id!r} is still open: ids must be unique")
        if request.prompt_tokens < 0:
            request = replace(request, prompt_tokens=self._count_tokens(request.prompt))
        now = self._clock()
        # No await between engine.submit and registering the stream, so no output can
        # arrive for an id the host does not know.
        self.engine.submit(request, now)
        stream = GenerationStream(self, request.id)
        self._open[request.id] = _Gen(stream, request, now)
        self._idle.clear()
        self._schedule_pump()
        return stream

    def cancel(self, request_id: RequestId, why: str = "cancelled by its caller") -> None:
        """End a request with `Cancelled`: a waiting one never joins, an active one frees
        its slot at its replica's next step and gets nothing more."""
        if request_id in self._open:
            self.engine.cancel(request_id, self._clock())
            self._end(request_id, Cancelled(f"request {request_id!r} {why}"))
            self._schedule_pump()

    def abort(self, error: BaseException) -> None:
        """Fail every open request with `error` now (replicas free them next step)."""
        now = self._clock()
        for rid in list(self._open):
            self.engine.cancel(rid, now)
            self._end(rid, error)
        self._cancel_timer()
        self._schedule_pump()

    def snapshot(self) -> HostSnapshot:
        """Waiting requests, steps in flight, active sequences and cumulative counts."""
        m = self.meter
        return HostSnapshot(
            self.engine.waiting_by_level(), tuple((s.client.name, int(s.busy))
                                                  for s in self._slots),
            dict(m.outcomes), replica_deaths=self._counts["replica_deaths"],
            active_sequences=self.engine.active, tokens_generated=m.tokens_generated,
            generations_cancelled=m.outcomes.get("cancelled", 0))

    def stats(self) -> dict[str, Any]:
        c = self._counts
        return {**self.engine.stats.as_dict(), "waiting": self.engine.waiting,
                "active": self.engine.active, "open_requests": len(self._open),
                "inflight_steps": sum(s.busy for s in self._slots), "replicas": len(self._slots),
                "replica_deaths": c["replica_deaths"], "completed": c["completed"],
                "failed": c["failed"], "cancelled": c["cancelled"], "compute_s": c["compute_s"],
                "mean_time_to_first_text_s": c["first_text_s"] / max(c["first_texts"], 1),
                "queue_hist": list(self.meter.join_waits.counts)}

    # -- the pump: the only place steps are formed -----------------------------------------
    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock()
        for slot in self.engine.dispatch_order([s for s in self._slots if not s.busy]):
            step = self.engine.next_step(now, slot)
            if step is not None:
                slot.busy = True
                if step.active:  # a leave-only step frees memory; it advances nothing
                    self.meter.sent(step, now, [(g.submitted_s, g.request.priority)
                                                for j in step.join if (g := self._open.get(j.id))])
                self._spawn(self._run(step, slot))
        for failure in self.engine.take_failures():
            self._end(failure.request_id, failure.error)
        self._arm_timer(self.engine.deadline(), now)

    async def _run(self, step: Step, slot: _Slot) -> None:
        try:
            outputs, compute_s = await slot.client.step(list(step.join), list(step.leave))
        except ReplicaDied as e:
            slot.busy = False
            self._replica_died(slot, e)
            return
        except asyncio.CancelledError:  # the host's loop is shutting down
            slot.busy = False
            if not slot.removed:
                self._fail_step(step, WorkerDied("the step was cancelled: the host is stopping"),
                                logging.WARNING)
            raise
        except Exception as e:  # the model's own error: this step's sequences only
            slot.busy = False
            if not slot.removed:
                self._fail_step(step, e)
            return
        slot.busy = False
        if slot.removed:
            return  # its sequences ended (or were requeued) when it was removed
        self._counts["compute_s"] += compute_s
        now = self._clock()
        try:
            live = self.engine.complete(step.id, outputs, now)
        except BatchSizeMismatch as e:
            self._fail_step(step, e)
            return
        first_text_s = self._deliver(live)
        self.meter.done(step, now, compute_s, first_text_s, sum(o.tokens for o in outputs))
        self._schedule_pump()

    def _fail_step(self, step: Step, error: BaseException, level: int = logging.ERROR) -> None:
        log.log(level, "step %d on %s failed (requests %s): %r", step.id,
                step.replica.client.name, list(step.active), error)
        self.meter.done(step, self._clock(), None)
        for rid in self.engine.fail_step(step.id, self._clock()):
            self._end(rid, error)
        self._schedule_pump()

    def _deliver(self, outputs: Sequence[StepOutput]) -> tuple[float, ...]:
        """Hand each output to its stream; the times to first text of those that got it."""
        now, counts, first = self._clock(), self._counts, []
        for out in outputs:
            g = self._open.get(out.id)
            if g is None:
                continue
            if out.error is not None:  # this sequence alone failed (it carries no text)
                self._end(out.id, out.error)
                continue
            g.num_tokens += out.tokens
            if out.text:
                if not g.parts:
                    first.append(now - g.submitted_s)
                    counts["first_text_s"] += first[-1]
                    counts["first_texts"] += 1
                g.parts.append(out.text)
                g.stream._push(TokenEvent(out.id, g.events, out.text))
                g.events += 1
            if out.finished is not None:
                del self._open[out.id]
                counts["completed"] += 1
                self.meter.ended(None)
                g.stream._push(Finished(out.id, "".join(g.parts), out.finished, g.num_tokens,
                                        g.request.prompt_tokens), last=True)
        if not self._open:
            self._idle.set()
        return tuple(first)

    def _end(self, request_id: RequestId, error: BaseException) -> None:
        g = self._open.pop(request_id, None)
        if g is None:
            return
        self._counts["cancelled" if isinstance(error, Cancelled) else "failed"] += 1
        self.meter.ended(error)
        g.stream._push(error, last=True)
        if not self._open:
            self._idle.set()

    def _replica_died(self, slot: _Slot, error: BaseException) -> None:
        if slot.removed:
            return
        self._counts["replica_deaths"] += 1
        log.error("replica %s died: %s", slot.client.name, error)
        self.remove_replica(slot.client, DIED)
        self._on_replica_died(slot.client)


class LocalStepClient:
    """A `StepReplicaClient` running a `Generator` in this process, one step at a time in
    its own worker thread (so the event loop keeps serving), after `overhead_s` of
    simulated transport (a Ray hop).

    >>> # host.add_replica(LocalStepClient(Generator(TinyLM()), "tinylm-0"))
    """

    def __init__(self, generator: Generator, name: str = "local", *,
                 overhead_s: float = 0.0, thread: bool = True) -> None:
        self.generator, self.name, self.overhead_s = generator, name, overhead_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name) if thread else None

    async def step(self, join: list[Join],
                   leave: list[RequestId]) -> tuple[list[StepOutput], float]:
        if self.overhead_s:
            await asyncio.sleep(self.overhead_s)
        if self._executor is None:
            return self._step(join, leave)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._step,
                                                                join, leave)

    def _step(self, join: list[Join], leave: list[RequestId]) -> tuple[list[StepOutput], float]:
        t0 = time.perf_counter()
        outputs = self.generator.step(join, leave)
        return outputs, time.perf_counter() - t0

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
