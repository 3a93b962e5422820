"""What a host tells its metrics recorder: stats as values, handed over per batch and step.

The engine never names a metric (vLLM v1 keeps the same split between its stats
dataclasses and its loggers). A host is handed a `Recorder` and gives it one
`BatchSent` per batch (or generation step) it sends, one `BatchDone` per batch
that comes back, and one `StepDone` per generation step; per-request facts
travel inside those values (the queue wait of every request a batch starts)
or as cumulative counts in the `HostSnapshot` a host answers `snapshot()` with,
which its owner samples on its own clock. Nothing here is called per request.

How the values become Prometheus series is `deployments.metrics`' business.
Here are the values, the `Recorder` protocol, `NullRecorder` (every host's
default: costs one method call per batch) and `MemoryRecorder` (keeps what it
is told, for tests and notebooks). Never imports Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from batching.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    QueueFull,
    SequenceLost,
    ServiceClosed,
    WorkerDied,
)

# How a request ended, as counted: a small fixed set, so it can be a label.
OUTCOMES = ("ok", "invalid", "queue_full", "deadline", "cancelled", "model_error",
            "worker_died", "closed")
_BY_CLASS = ((InvalidRequest, "invalid"), (QueueFull, "queue_full"),
             (DeadlineExceeded, "deadline"), (Cancelled, "cancelled"),
             (WorkerDied, "worker_died"), (SequenceLost, "worker_died"),
             (ServiceClosed, "closed"))
STEP = "step"  # the flush reason of a generation step (steps are not formed by a policy)


def outcome_of(error: BaseException | None) -> str:
    """The outcome a request that ended with `error` is counted under (None: "ok").

    >>> outcome_of(QueueFull("full")), outcome_of(ZeroDivisionError())
    ('queue_full', 'model_error')
    """
    if error is None:
        return "ok"
    for cls, name in _BY_CLASS:
        if isinstance(error, cls):
            return name
    return "model_error"  # the model's own exception, BatchSizeMismatch, anything else


@dataclass(frozen=True, slots=True)
class BatchSent:
    """A batch (or a generation step) left for a replica."""

    num_items: int  # items of a batch; sequences advanced by a step
    cost: float  # the policy's cost (items unless a cost_fn is set); a step's tokens
    reason: str  # a FlushReason value, or STEP
    queue_waits_s: tuple[float, ...]  # each request this batch starts: how long it queued
    levels: tuple[int, ...]  # the priority level of each of those requests


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A batch (or step) came back."""

    num_items: int
    latency_s: float  # from forming it to its answer: transport and replica queue included
    compute_s: float | None  # as the replica measured it; None when the batch failed


@dataclass(frozen=True, slots=True)
class StepDone:
    """What one generation step produced."""

    tokens: int  # tokens generated (every sequence of the step advanced by one, or 0)
    first_text_s: tuple[float, ...]  # time to first text of each sequence that got it now
    inter_token_s: float | None  # time since the replica's previous step, seen by every
    # sequence that was in both; None when no sequence was (a replica that was idle)


@dataclass(frozen=True, slots=True)
class LevelDepth:
    """What waits at one priority level."""

    level: int
    requests: int
    items: int


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """A host's gauges and cumulative counts at one instant (sampled, not pushed).

    Counts only grow; a sampler turns them into increments. `outcomes` counts the
    requests the host accepted and ended (a request refused by `submit` was never
    open: whoever called submit counts it).
    """

    queued: tuple[LevelDepth, ...]
    inflight: tuple[tuple[str, int], ...]  # (replica name, batches or steps in flight)
    outcomes: Mapping[str, int]
    replica_deaths: int = 0
    retried_batches: int = 0
    live_sequences: int | None = None  # sequence models only
    sequences_lost: int = 0
    sequences_idle_expired: int = 0
    active_sequences: int | None = None  # generative models only
    tokens_generated: int = 0
    generations_cancelled: int = 0


class Recorder(Protocol):
    """Where a host hands its per-batch and per-step values."""

    def batch_sent(self, batch: BatchSent) -> None: ...

    def batch_done(self, batch: BatchDone) -> None: ...

    def step_done(self, step: StepDone) -> None: ...


class NullRecorder:
    """Records nothing: what a host gets when it is handed no recorder."""

    __slots__ = ()

    def batch_sent(self, batch: BatchSent) -> None:
        pass

    def batch_done(self, batch: BatchDone) -> None:
        pass

    def step_done(self, step: StepDone) -> None:
        pass


NULL_RECORDER = NullRecorder()


@dataclass
class MemoryRecorder:
    """Keeps every value it is handed, in order.

    >>> rec = MemoryRecorder()
    >>> rec.batch_sent(BatchSent(2, 2.0, "full", (0.001, 0.002), (1, 1)))
    >>> rec.reasons, rec.queue_waits_s
    ({'full': 1}, [0.001, 0.002])
    """

    sent: list[BatchSent] = field(default_factory=list)
    done: list[BatchDone] = field(default_factory=list)
    steps: list[StepDone] = field(default_factory=list)

    def batch_sent(self, batch: BatchSent) -> None:
        self.sent.append(batch)

    def batch_done(self, batch: BatchDone) -> None:
        self.done.append(batch)

    def step_done(self, step: StepDone) -> None:
        self.steps.append(step)

    @property
    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.sent:
            out[b.reason] = out.get(b.reason, 0) + 1
        return out

    @property
    def queue_waits_s(self) -> list[float]:
        return [w for b in self.sent for w in b.queue_waits_s]
