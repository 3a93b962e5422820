"""Values on the hot path: requests, the parts of them a batch carries, batches.

A request carries `num_items` items (a leading batch dimension); a batch is a
list of `Part`s, each a contiguous slice [start, stop) of one request, so a
request can be split across batches and joined again by the ledger. Results are
matched to requests by `RequestId` and offsets, never by position in a queue or
by object identity. The engine never looks inside `items` except through the
policy's `cost_fn`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RequestId = int | str


class FlushReason(str, enum.Enum):
    """Why a batch was sent; recorded on every batch and counted in statistics."""

    FULL = "full"  # max_batch_size items or max_batch_cost reached
    PREFERRED = "preferred"  # the largest preferred batch size was reached
    DELAY = "delay"  # the oldest request waited max_queue_delay_s (or the adaptive delay)
    DEADLINE = "deadline"  # a request's deadline leaves no time to wait for more
    DRAIN = "drain"  # the host is closing and flushes what is queued
    IDLE = "idle"  # idle_dispatch: nothing was in flight, so nobody was worth waiting for


@dataclass(frozen=True, slots=True)
class Request:
    """One client request: `items` has a leading batch dimension of `num_items`.

    `single=True` marks a request of exactly one item whose result is that item's
    result rather than a sequence of one.

    >>> Request("a", (3,), single=True).num_items
    1
    """

    id: RequestId
    items: Sequence[Any]
    single: bool = False
    priority: int | None = None  # 1 = highest; None or 0 = the policy's default level
    timeout_s: float | None = None  # relative to submission
    num_items: int = field(default=-1)
    # the clients' requests it stands for, as counted (requests, queue waits): a block of
    # requests a server gathered (the native front's) is one request of the engine
    requests: int = 1

    def __post_init__(self) -> None:
        if self.num_items < 0:
            object.__setattr__(self, "num_items", len(self.items))


@dataclass(frozen=True, slots=True)
class Part:
    """Items [start, stop) of request `request_id`, carried by one batch."""

    request_id: RequestId
    start: int
    stop: int

    @property
    def num_items(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class Batch:
    """What a policy hands the host to run on one replica."""

    id: int
    parts: tuple[Part, ...]
    num_items: int
    cost: float
    reason: FlushReason
    created_s: float

    @property
    def ids(self) -> list[RequestId]:
        """Request ids in batch order, each once (a request appears once per batch)."""
        return [p.request_id for p in self.parts]


class Rows(NamedTuple):
    """The value of a request some of whose items were withdrawn before they ran
    (`batching.dynamic.withdraw`): `value` holds the results of the items `rows` (indices
    into the request as submitted, ascending) and of no other. A tuple: it pickles as one,
    across a Ray call or a direct connection."""

    value: Any
    rows: Any  # np.ndarray of int64


@dataclass(frozen=True, slots=True)
class Failure:
    """A request the policy ended without running it (expired, for example)."""

    request_id: RequestId
    error: BaseException
