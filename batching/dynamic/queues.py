"""The queue of one priority level: earliest deadline first, then delayed requests.

Requests without a deadline sort as deadline = +inf, after every request that
has one, in arrival order (the sequence number breaks ties), so a level with no
timeouts is plain FIFO. A request whose timeout passed under
`timeout_action=delay` moves to `delayed` and is served after every unexpired
request of its level. Removal (cancel, expiry, full dispatch) is lazy in the
heap: the entry is flagged and skipped when it surfaces.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batching.errors import InvalidRequest
from batching.types import Request


@dataclass(slots=True, eq=False)
class Entry:
    """A queued request and how much of it is still waiting to be dispatched."""

    request: Request
    level: int
    arrival_s: float
    deadline_s: float  # math.inf when the request has no deadline
    seq: int
    cum_cost: list[float] | None  # prefix sums of item costs; None: every item costs 1
    offset: int = 0  # first item not yet dispatched
    delayed: bool = False
    removed: bool = False
    length: float = 0.0  # the items' length (tokens...), when the policy groups by length

    @property
    def remaining_items(self) -> int:
        return self.request.num_items - self.offset

    def cost(self, start: int, stop: int) -> float:
        if self.cum_cost is None:
            return float(stop - start)
        return self.cum_cost[stop] - self.cum_cost[start]

    @property
    def remaining_cost(self) -> float:
        return self.cost(self.offset, self.request.num_items)

    def fit(self, room_items: int, room_cost: float) -> int:
        """How many of the remaining items fit in `room_items` items and `room_cost` cost."""
        k = min(self.remaining_items, room_items)
        if self.cum_cost is None:
            return min(k, int(room_cost + 1e-9)) if room_cost != math.inf else k
        limit = self.cum_cost[self.offset] + room_cost + 1e-9
        stop = bisect_right(self.cum_cost, limit, self.offset, self.offset + k + 1) - 1
        return stop - self.offset


@dataclass(slots=True)
class LevelQueue:
    live: list[tuple[float, int, Entry]] = field(default_factory=list)
    delayed: deque[Entry] = field(default_factory=deque)
    count: int = 0  # requests queued here, partly dispatched ones included
    items: int = 0  # their items not yet dispatched
    cost: float = 0.0  # and those items' cost
    latest_deadline_s: float = -math.inf  # of every entry pushed (none is ever later)
    arrivals: deque[Entry] = field(default_factory=deque)  # in arrival order, lazily trimmed

    def push(self, entry: Entry) -> None:
        heapq.heappush(self.live, (entry.deadline_s, entry.seq, entry))
        self.oldest_arrival()  # trims the ended ones, so the deque stays as long as the queue
        self.arrivals.append(entry)  # pushed as they come: oldest first
        self.count += 1
        self.latest_deadline_s = max(self.latest_deadline_s, entry.deadline_s)

    def oldest_arrival(self) -> float:
        """When the longest-queued entry still here arrived (math.inf: none is)."""
        arrivals = self.arrivals
        while arrivals and arrivals[0].removed:
            arrivals.popleft()
        return arrivals[0].arrival_s if arrivals else math.inf

    def head(self) -> Entry | None:
        """The next entry to dispatch, skipping removed ones."""
        live, delayed = self.live, self.delayed
        while live and live[0][2].removed:
            heapq.heappop(live)
        if live:
            return live[0][2]
        while delayed and delayed[0].removed:
            delayed.popleft()
        return delayed[0] if delayed else None

    def earliest_deadline(self) -> float:
        live = self.live
        while live and live[0][2].removed:
            heapq.heappop(live)
        return live[0][0] if live else math.inf

    def in_order(self) -> list[Entry]:
        """The entries still queued, in the order they are served."""
        live = [e for _, _, e in sorted(self.live, key=lambda t: t[:2]) if not e.removed]
        return live + [e for e in self.delayed if not e.removed]

    def pop_expired(self, now: float) -> list[Entry]:
        """Entries of `live` whose deadline is at or before `now`, earliest first."""
        out = []
        live = self.live
        while live and (live[0][2].removed or live[0][0] <= now):
            entry = heapq.heappop(live)[2]
            if not entry.removed:
                out.append(entry)
        return out


def cumulative_costs(request: Request, cost_fn: Callable[[Any], float] | None,
                     max_cost: float) -> list[float] | None:
    """Prefix sums of the request's item costs (None without a cost_fn); an item costing
    less than 0 or more than a whole batch may is refused with InvalidRequest."""
    if cost_fn is None:
        return None
    cum = [0.0]
    for i, item in enumerate(request.items):
        c = float(cost_fn(item))
        if not c >= 0 or c > max_cost:
            raise InvalidRequest(
                f"item {i} of request {request.id!r} costs {c}: item costs must lie in "
                f"[0, max_batch_cost={max_cost}]; split the item or raise max_batch_cost"
            )
        cum.append(cum[-1] + c)
    return cum
