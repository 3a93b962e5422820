"""Withdrawing some items of a queued request: those not yet in a batch never run.

Why: a server may send several clients' requests as one engine request (the native HTTP
front's blocks, `Request.requests`). When some of those clients hang up, cancelling the
request would fail the ones still waiting, and running it whole spends the model on answers
nobody reads. So their items are withdrawn from what of the request is still queued; those
already in a batch run (a batch's inputs are fixed when it is formed), and the answer says
which items it carries (`batching.types.Rows`), so the caller maps rows by index, never by
position.

How: the queued entry's request is compacted: its items already dispatched [0, offset)
stay as they are (the parts in flight keep their offsets), and the queued rest loses the
withdrawn items; the entry's costs, its level's items and cost, and the batcher's totals
lose theirs (`DynamicBatcher.cancel_rows`). The host keeps, per request, which rows of the
request as submitted it still carries (`Held`), shrinks the ledger's expected item count,
and counts each client's request whose every item was withdrawn as cancelled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from batching.dynamic.queues import Entry, LevelQueue
from batching.errors import InvalidRequest
from batching.tensors import TensorBatch
from batching.types import Request


class Cut(NamedTuple):
    """What `DynamicBatcher.cancel_rows` withdrew: the items' indices (into the request as
    it was queued), the request as queued now, and the items and cost taken off the queue."""

    rows: np.ndarray
    request: Request
    items: int
    cost: float


def checked_rows(rows: Any, total: int, request_id: Any) -> np.ndarray:
    """`rows` as sorted unique item indices of a request of `total` items; InvalidRequest
    for anything else (not a flat list of integers, or an index out of range)."""
    try:
        index = np.asarray(rows)
    except Exception:
        index = None
    if index is None or index.ndim != 1 or (index.size and index.dtype.kind not in "iu"):
        raise InvalidRequest(f"rows to withdraw of request {request_id!r} must be a flat list "
                             f"of item indices (integers); got {type(rows).__name__}")
    if index.size and (index.min() < 0 or index.max() >= total):
        bad = index[(index < 0) | (index >= total)][0]
        raise InvalidRequest(f"row {bad} is not an item of request {request_id!r}: it has "
                             f"{total} items (0..{total - 1})")
    return np.unique(index.astype(np.int64))


def withdraw(entry: Entry, queue: LevelQueue, rows: Any,
             length_fn: Any = None) -> Cut | None:
    """Withdraw the items `rows` of queued `entry` that are not in a batch yet: the entry's
    request compacted, its costs and `queue`'s counts updated (the entry flagged removed,
    and counted out of `queue`, if nothing of it waits any more). None if none was."""
    request = entry.request
    index = checked_rows(rows, request.num_items, request.id)
    taken = index[index >= entry.offset]
    if not len(taken):
        return None
    items, cost = entry.remaining_items, entry.remaining_cost
    keep = np.ones(request.num_items, bool)
    keep[taken] = False
    left = np.flatnonzero(keep)
    new_items = _select(request.items, left)
    entry.request = dataclasses.replace(request, items=new_items, num_items=len(left))
    if entry.cum_cost is not None:
        each = np.diff(np.asarray(entry.cum_cost))[left]
        entry.cum_cost = [0.0, *np.cumsum(each).tolist()]
    if length_fn is not None and len(left):
        entry.length = float(length_fn(new_items))
    items -= entry.remaining_items
    cost -= entry.remaining_cost
    queue.items -= items
    queue.cost -= cost
    if not entry.remaining_items:  # nothing of it waits now: as once fully dispatched
        entry.removed = True
        queue.count -= 1
    return Cut(taken, entry.request, items, cost)


def _select(items: Any, index: np.ndarray) -> Any:
    """`items` at `index` (ascending), of the kinds a request's items are."""
    if isinstance(items, np.ndarray):
        return items[index]
    if isinstance(items, TensorBatch):
        return TensorBatch({name: _select(a, index) for name, a in items.tensors.items()})
    return [items[i] for i in index.tolist()]


class Held:
    """Which rows of a request as submitted it still carries, by position now; and, where
    its items divide evenly among the clients' requests it stands for (`Request.requests`),
    which of those still have a row in it."""

    __slots__ = ("per", "rows", "total")

    def __init__(self, request: Request) -> None:
        self.total = n = request.num_items
        clients = request.requests
        self.per = n // clients if clients > 1 and n % clients == 0 else 0
        self.rows = np.arange(n, dtype=np.int64)

    def positions(self, rows: Any, request_id: Any) -> np.ndarray:
        """The positions now of the rows `rows` (of the request as submitted) it still
        carries; InvalidRequest for rows that are not the request's."""
        wanted = checked_rows(rows, self.total, request_id)
        return np.flatnonzero(np.isin(self.rows, wanted))

    def drop(self, positions: np.ndarray) -> int:
        """Forget the rows at `positions`; how many clients' requests lost their last row."""
        before = self.clients()
        self.rows = np.delete(self.rows, positions)
        return before - self.clients()

    def clients(self) -> int:
        return len(np.unique(self.rows // self.per)) if self.per else 0


class RowsWithdrawal:
    """`BatchHost.cancel_rows`, kept here with the rest of a withdrawal: a base of the host,
    using its open requests (`_open`), engine, ledger, clock, `cancel` and `_settle`; the
    host turns a value into `Rows` where `_held` has its request."""

    _held: dict[Any, Held]  # request id -> the rows it still carries, once any is withdrawn

    def cancel_rows(self: Any, request_id: Any, rows: Any,
                    why: str = "cancelled by its caller") -> int:
        """Withdraw the items `rows` (indices into the request as submitted) of an open
        request that are still queued; those already in a batch run, and its answer is
        then `Rows` (the value of the rows it carries, and which). Every row it still has:
        as `cancel`. Returns how many rows were withdrawn (0: none was still queued, or the
        request is not open); InvalidRequest for rows that are not the request's."""
        rec = self._open.get(request_id)
        if rec is None or request_id not in self.ledger:
            return 0
        held = self._held.get(request_id) or Held(rec.request)
        at = held.positions(rows, request_id)
        if len(at) and len(at) == len(held.rows):  # every row it still has
            self.cancel(request_id, why)
            return len(at)
        cut = self.engine.cancel_rows(request_id, at, self._clock()) if len(at) else None
        if cut is None:
            return 0  # none of them is still queued: they run, and come back with the rest
        self._held[request_id] = held
        gone = held.drop(cut.rows)  # clients' requests that lost every row: cancelled
        rec.request = dataclasses.replace(cut.request, requests=max(rec.request.requests - gone, 1))
        if gone:
            self.outcomes["cancelled"] = self.outcomes.get("cancelled", 0) + gone
            self.engine.stats.record_outcome(False, self._clock() - rec.submitted_s, gone)
        self._settle(self.ledger.shrink(request_id, cut.request.num_items))
        return len(cut.rows)
