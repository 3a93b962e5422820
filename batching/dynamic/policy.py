"""Dynamic-batching settings a user writes: validated once, at the edge.

`DynamicPolicy` mirrors Triton's `dynamic_batching` block (max batch size,
queue delay, preferred sizes, priority levels with a queue policy each,
preserve_ordering) and adds what Triton lacks: a per-item cost with
`max_batch_cost`, per-request deadlines served earliest-first, and an adaptive
delay driven by a latency model learned online. Messages name the value and
the fix, because these come from YAML files and CLI flags.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batching.sizes import check_preferred_fit, sorted_sizes


class TimeoutAction(str, enum.Enum):
    REJECT = "reject"  # fail the request with DeadlineExceeded; it never runs
    DELAY = "delay"  # run it after every unexpired request of its level and above


class QueuePolicy(BaseModel):
    """Limits of one priority level's queue (Triton's `ModelQueuePolicy`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_queue_size: int | None = Field(default=None, ge=1)
    """Requests this level may hold; one more is rejected at once with QueueFull.
    None: unbounded."""
    default_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds a request may wait in the queue when it names no timeout. None: forever."""
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    """What happens to a request whose timeout passes while it is queued."""
    allow_timeout_override: bool = True
    """Whether a request's own timeout counts; it may only lower `default_timeout_s`."""


class DynamicPolicy(BaseModel):
    """How requests of a stateless model are gathered into batches.

    >>> DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.002).max_batch_size
    64
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)

    kind: Literal["dynamic"] = "dynamic"
    """Which scheduler: dynamic (stateless), sequence (stateful) or iterative (generative)."""
    max_batch_size: int = Field(default=32, ge=1)
    """Most items in one batch."""
    max_queue_delay_s: float = Field(default=0.0, ge=0)
    """Longest the oldest queued request waits for a fuller batch; 0 never waits."""
    idle_dispatch: bool = False
    """Send at once, without waiting `max_queue_delay_s`, when no batch of this model is
    in flight (every replica idle): a lone request then pays no delay. Under load some
    batch is always in flight and the delay applies as usual. False keeps Triton's
    semantics (the oldest request always waits the delay for a fuller batch)."""
    fill_while_busy: bool = False
    """While every replica is running a batch, keep filling the next one past
    `max_queue_delay_s`, until the first running batch is predicted to end (by the
    latency model, less `busy_lead_s`): the batch could not start sooner, so its requests
    lose nothing by the wait and more join them. It matters with pipeline slots
    (`replicas.max_inflight_batches` > 1), which otherwise take a batch as soon as the
    delay runs out, however long the replica stays busy. Full, preferred, deadline and
    drain sends are unchanged; with a cold latency model or an idle replica the delay
    applies as usual. False: the delay alone decides."""
    busy_lead_s: float = Field(default=0.001, ge=0)
    """With `fill_while_busy`: how long before a running batch's predicted end the held
    batch is sent (about the time a batch takes to reach a replica)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Sizes worth waiting for: a batch is sent once the largest that fits is reached."""
    max_batch_cost: float | None = Field(default=None, gt=0)
    """Most total cost in one batch (cost per item from `cost_fn`, 1 by default)."""
    cost_fn: Callable[[Any], float] | None = Field(default=None, exclude=True)
    """Cost of one item (tokens, rows...); None counts every item as 1."""
    priority_levels: int = Field(default=1, ge=1)
    """Number of priority levels; 1 is the highest."""
    default_priority_level: int | None = Field(default=None, ge=1)
    """Level of a request that names none; None means the lowest level."""
    default_queue_policy: QueuePolicy = QueuePolicy()
    """Queue policy of every level not named in `priority_queue_policy`."""
    priority_queue_policy: dict[int, QueuePolicy] = Field(default_factory=dict)
    """Queue policy per level, overriding `default_queue_policy`."""
    deadline_admission: bool = True
    """Refuse at once (Overloaded: HTTP 429 with Retry-After) a request with a deadline
    that the model cannot serve in time at its measured service rate, and shed a queued
    one that can no longer make it, instead of letting it wait out its timeout
    (`batching.dynamic.admission`). Levels with `timeout_action=delay` are exempt. False:
    such requests wait until their deadline passes (DeadlineExceeded, HTTP 504)."""
    max_queue_wait_s: float | None = Field(default=None, gt=0)
    """Refuse at once (Overloaded: HTTP 429, Retry-After from the prediction) a request whose
    predicted wait exceeds this many seconds, or its own deadline if sooner: the work in
    flight and queued ahead of it, in full batches, each taking a replica's share of a
    batch's time (measured; before that, the latency model's, which a deployment seeds
    with the replicas' warm-up batches; with no batch timed, 0.1 s). A burst the
    replicas can serve inside it is accepted whatever its size; a queued request that
    would start past its arrival plus this (the service slowed) is shed before it runs,
    with the same error. None: no wait bound
    (deployments get `limits.max_queue_wait_s`, 1 s, unless this is set)."""
    preserve_ordering: bool = False
    """Release responses in the order requests arrived."""
    adaptive_delay: bool = False
    """Wait as long as each request's latency target allows, by a learned latency model."""
    target_latency_s: float | None = Field(default=None, gt=0)
    """End-to-end latency a request without its own deadline should get (adaptive delay)."""
    group_by_length: bool = False
    """Batch items of similar length together (ragged models, where a batch is padded to
    its longest item): a batch starts with the request next in line, then takes the
    queued requests nearest to it in length. Off: strict priority/deadline/arrival order."""
    length_window: int = Field(default=1024, ge=1)
    """Queued requests of a priority level looked at when grouping by length."""
    length_fn: Callable[[Any], float] | None = Field(default=None, exclude=True)
    """Length of a request's items (tokens, characters); on Ray, taken from the model's
    ragged or BYTES input when not given."""

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _sorted_positive(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        return sorted_sizes(sizes)

    @model_validator(mode="after")
    def _consistent(self) -> DynamicPolicy:
        check_preferred_fit(self.preferred_batch_sizes, self.max_batch_size)
        if self.cost_fn is None and self.max_batch_cost is not None and self.max_batch_cost < 1:
            raise ValueError(
                f"max_batch_cost={self.max_batch_cost} is below 1, the cost of an item when no "
                "cost_fn is given: raise it or give a cost_fn"
            )
        levels = self.priority_levels
        if self.default_priority_level is not None and self.default_priority_level > levels:
            raise ValueError(
                f"default_priority_level={self.default_priority_level} is out of range: "
                f"priority_levels={levels}, so use 1..{levels}"
            )
        for level in self.priority_queue_policy:
            if not 1 <= level <= levels:
                raise ValueError(
                    f"priority_queue_policy names level {level}, but priority_levels={levels}: "
                    f"use levels 1..{levels}"
                )
        if self.adaptive_delay and self.target_latency_s is None:
            raise ValueError(
                "adaptive_delay=True needs target_latency_s, the end-to-end latency a request "
                "may take (e.g. target_latency_s=0.05)"
            )
        return self

    @property
    def default_level(self) -> int:
        return self.default_priority_level or self.priority_levels

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    @property
    def largest_preferred(self) -> int | None:
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else None
