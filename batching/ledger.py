"""The request-ID ledger: which request gets which result, and when it is released.

Results are matched by `RequestId` and item offsets, never by position in a
queue: a batch's results (a sequence, an array, or a `TensorBatch` of named outputs,
cut per name) are cut along its `Part`s, a request split across
batches is joined once all its parts are back (in item order, whatever order
the batches finished in), and a request ends exactly once: a late part of a
request that already failed or was cancelled is dropped here, not delivered.

With `preserve_ordering`, outcomes are released in arrival order: a finished
request waits for every earlier one to end (with a result or an error).
The ledger is pure: it returns `Outcome`s and the host sets futures from them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batching.errors import BatchSizeMismatch
from batching.tensors import TensorBatch
from batching.types import Batch, Request, RequestId


@dataclass(frozen=True, slots=True)
class ItemFailed:
    """What a model puts in place of one item's result when only that item failed.

    The request owning the item fails with `error`; the rest of the batch is unaffected.
    """

    error: BaseException


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of one request: `value` if `error` is None."""

    request_id: RequestId
    value: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Open:
    num_items: int
    single: bool
    received: int = 0
    parts: dict[int, Any] = field(default_factory=dict)  # start offset -> results
    outcome: Outcome | None = None


class Ledger:
    """Tracks open requests from `open` until their outcome is released.

    >>> from batching.types import Part, FlushReason
    >>> led = Ledger()
    >>> led.open(Request("a", (3,), single=True))
    >>> b = Batch(0, (Part("a", 0, 1),), 1, 1.0, FlushReason.FULL, 0.0)
    >>> led.deliver(b, [9])
    [Outcome(request_id='a', value=9, error=None)]
    """

    def __init__(self, preserve_ordering: bool = False) -> None:
        self.preserve_ordering = preserve_ordering
        self._open: OrderedDict[RequestId, _Open] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, request_id: RequestId) -> bool:
        rec = self._open.get(request_id)
        return rec is not None and rec.outcome is None

    def open(self, request: Request) -> None:
        if request.id in self._open:
            raise ValueError(f"request id {request.id!r} is already open: ids must be unique")
        self._open[request.id] = _Open(request.num_items, request.single)

    def deliver(self, batch: Batch, results: Sequence[Any]) -> list[Outcome]:
        """Hand a batch's results to its requests; a wrong count fails the whole batch."""
        if len(results) != batch.num_items:
            return self.fail_batch(batch, BatchSizeMismatch(
                f"model returned {len(results)} results for a batch of {batch.num_items} items; "
                "transform/postprocess must return one result per input item"
            ))
        ended: list[RequestId] = []
        offset = 0
        for part in batch.parts:
            n = part.num_items
            rec = self._open.get(part.request_id)
            chunk = results[offset : offset + n]
            offset += n
            if rec is None or rec.outcome is not None:
                continue  # the request already ended (failed, cancelled): drop the late part
            if part.start in rec.parts:
                continue  # this part came back before (a retried batch): count it once
            failed = _first_failure(chunk)
            if failed is not None:
                rec.outcome = Outcome(part.request_id, error=failed)
            else:
                rec.parts[part.start] = chunk
                rec.received += n
                if rec.received == rec.num_items:
                    rec.outcome = Outcome(part.request_id, value=_join(rec))
            if rec.outcome is not None:
                ended.append(part.request_id)
        return self._release(ended)

    def shrink(self, request_id: RequestId, num_items: int) -> list[Outcome]:
        """Request `request_id` now carries `num_items` items (some not yet dispatched were
        withdrawn: `batching.dynamic.withdraw`); it ends once those are back, now if they
        are (its value: the parts back, in item order)."""
        rec = self._open.get(request_id)
        if rec is None or rec.outcome is not None or num_items < 1:
            return []
        rec.num_items = num_items
        if rec.received < num_items:
            return []
        rec.outcome = Outcome(request_id, value=_join(rec))
        return self._release([request_id])

    def fail(self, request_id: RequestId, error: BaseException) -> list[Outcome]:
        """End one request with `error` (no-op if it already ended)."""
        rec = self._open.get(request_id)
        if rec is None or rec.outcome is not None:
            return []
        rec.outcome = Outcome(request_id, error=error)
        return self._release([request_id])

    def fail_batch(self, batch: Batch, error: BaseException) -> list[Outcome]:
        """End every request of `batch` that is still open with `error`."""
        ended = []
        for part in batch.parts:
            rec = self._open.get(part.request_id)
            if rec is not None and rec.outcome is None:
                rec.outcome = Outcome(part.request_id, error=error)
                ended.append(part.request_id)
        return self._release(ended)

    def fail_all(self, error: BaseException) -> list[Outcome]:
        ids = [rid for rid, rec in self._open.items() if rec.outcome is None]
        for rid in ids:
            self._open[rid].outcome = Outcome(rid, error=error)
        return self._release(ids)

    def _release(self, ended: list[RequestId]) -> list[Outcome]:
        if not ended:
            return []
        if not self.preserve_ordering:
            return [self._open.pop(rid).outcome for rid in ended]  # type: ignore[misc]
        out = []
        while self._open:
            rid, rec = next(iter(self._open.items()))
            if rec.outcome is None:
                break
            del self._open[rid]
            out.append(rec.outcome)
        return out


def _first_failure(chunk: Sequence[Any]) -> BaseException | None:
    if isinstance(chunk, TensorBatch) or (isinstance(chunk, np.ndarray) and chunk.dtype != object):
        return None
    for r in chunk:
        if isinstance(r, ItemFailed):
            return r.error
    return None


def _join(rec: _Open) -> Any:
    if rec.single:
        return rec.parts[0][0]
    if len(rec.parts) == 1:
        return rec.parts[0]
    chunks = [rec.parts[k] for k in sorted(rec.parts)]
    if all(isinstance(c, np.ndarray) for c in chunks):
        return np.concatenate(chunks)
    if all(isinstance(c, TensorBatch) for c in chunks):
        return TensorBatch.concatenate(chunks)
    return [r for c in chunks for r in c]
