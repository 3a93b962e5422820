"""The stateful model interface and the replica-side keeper of per-sequence state.

A `StatefulTransformer` sees a whole batch of rows, each a step of a different
sequence, with that sequence's state: `transform(inputs, states, controls)`
returns one output and one new state per row. The model never stores state
itself; the `StateStore` in the replica does, keyed by sequence id, so the
same model object serves any number of sequences and a restarted replica
knows which sequences it lost.

`StateStore.run` commits all or nothing: when the model raises, no state
changes (the batcher treats the batch's sequences as not advanced). A start
row gets `initial_state()` before the model runs; an end row's state is
dropped after it; a not-ready row (direct batching) is shown to the model,
with state None, but its outputs and new state are ignored, so it can never
change anyone's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from batching.errors import BatchSizeMismatch, SequenceLost
from batching.ledger import ItemFailed
from batching.model import writable
from batching.sequence.types import SequenceBatch, SequenceId
from batching.types import RequestId


@dataclass(frozen=True, slots=True)
class SequenceBatchInput:
    """What the host sends a replica for one batch (picklable, small).

    `items` holds one row per batch row: one stacked np.ndarray when the items are
    arrays (a not-ready row is zeros shaped like a ready one), else a list (None
    for a not-ready row). The tuples are the batch's controls, one entry per row.
    """

    items: Any
    sequence_ids: tuple[SequenceId | None, ...]
    start: tuple[bool, ...]
    end: tuple[bool, ...]
    ready: tuple[bool, ...]

    @property
    def rows(self) -> int:
        return len(self.ready)


class StatefulTransformer:
    """Base class of stateful batched models.

    >>> class Count(StatefulTransformer):
    ...     def initial_state(self):
    ...         return 0
    ...     def transform(self, inputs, states, controls):
    ...         new = [None if s is None else s + 1 for s in states]
    ...         return new, new
    >>> StateStore(Count()).run(SequenceBatchInput([7], (1,), (True,), (False,), (True,)))
    [1]
    """

    device: str = "cpu"

    def setup(self, device: str) -> None:
        """Called once before the first batch, with "cpu" or "cuda:N"."""
        self.device = device

    def initial_state(self) -> Any:
        """The state of a sequence at its start."""
        return None

    def transform(self, inputs: Any, states: list[Any],
                  controls: SequenceBatchInput) -> tuple[Sequence[Any], list[Any]]:
        """One output and one new state per row; `states[i]` is None where not ready."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement transform(inputs, states, controls)")


class StateStore:
    """Runs a `StatefulTransformer` on batches, keeping each live sequence's state."""

    def __init__(self, model: StatefulTransformer) -> None:
        self.model = model
        self._states: dict[SequenceId, Any] = {}

    @property
    def live(self) -> int:
        return len(self._states)

    def __contains__(self, sequence_id: SequenceId) -> bool:
        return sequence_id in self._states

    def run(self, batch: SequenceBatchInput) -> list[Any]:
        """One result per row: the output, None for a not-ready row, or
        ItemFailed(SequenceLost) for a row whose sequence has no state here."""
        states, lost = self._gather(batch)
        controls = batch
        if lost:  # the model must not see a row whose state is gone as ready
            controls = replace(batch, ready=tuple(r and i not in lost
                                                  for i, r in enumerate(batch.ready)))
        outputs, new_states = self.model.transform(writable(batch.items), states, controls)
        if len(outputs) != batch.rows or len(new_states) != batch.rows:
            raise BatchSizeMismatch(
                f"{type(self.model).__name__}.transform returned {len(outputs)} outputs and "
                f"{len(new_states)} states for a batch of {batch.rows} rows: return one of "
                "each per row"
            )
        results: list[Any] = []
        for i, ready in enumerate(controls.ready):  # commit: the model returned normally
            if i in lost:
                results.append(lost[i])
            elif not ready:
                results.append(None)
            else:
                self._commit(batch.sequence_ids[i], batch.end[i], new_states[i])
                results.append(outputs[i])
        return results

    def release(self, sequence_ids: Sequence[SequenceId]) -> int:
        """Drop the states of `sequence_ids` (ended by the idle timeout); returns how many
        were here."""
        return sum(self._states.pop(sid, _MISSING) is not _MISSING for sid in sequence_ids)

    def _gather(self, batch: SequenceBatchInput) -> tuple[list[Any], dict[int, ItemFailed]]:
        states: list[Any] = []
        lost: dict[int, ItemFailed] = {}
        for i, sid in enumerate(batch.sequence_ids):
            if not batch.ready[i]:
                states.append(None)
            elif batch.start[i]:
                states.append(self.model.initial_state())
            elif sid in self._states:
                states.append(self._states[sid])
            else:
                states.append(None)
                lost[i] = ItemFailed(SequenceLost(
                    f"sequence {sid!r} has no state on this replica: the replica holding it "
                    "died or restarted and its state is gone; start it again with "
                    "sequence_start"
                ))
        return states, lost

    def _commit(self, sid: SequenceId, end: bool, state: Any) -> None:
        if end:
            self._states.pop(sid, None)
        else:
            self._states[sid] = state


_MISSING = object()


def make_batch_input(batch: SequenceBatch,
                     items_by_request_id: Mapping[RequestId, Any]) -> SequenceBatchInput:
    """The replica's input for `batch`, taking each ready row's item by its request id.

    Array items of one shape and dtype become one contiguous array (one array pickles
    far faster than a list of rows); a not-ready row is zeros like a ready row.
    """
    rows = [None if rid is None else items_by_request_id[rid] for rid in batch.request_ids]
    ready = [x for x, r in zip(rows, batch.ready) if r]
    first = ready[0] if ready else None
    if isinstance(first, np.ndarray) and all(
        isinstance(x, np.ndarray) and x.shape == first.shape and x.dtype == first.dtype
        for x in ready
    ):
        zeros = np.zeros_like(first)
        items: Any = np.stack([x if r else zeros for x, r in zip(rows, batch.ready)])
    else:
        items = rows
    return SequenceBatchInput(items, batch.sequence_ids, batch.start, batch.end, batch.ready)
