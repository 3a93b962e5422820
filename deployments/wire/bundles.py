"""A bundle on the wire: typed entries, and one stacked array instead of one per request.

A bundle (`deployments.ingress.coalesce`) carries up to a batch of requests to a batching actor
(or through the handle to an ingress-placed engine), each one `Entry`, and its answer
carries one `(key, value, error)` per request back. As a list of entries, every request's
array is its own buffer to Ray's serializer, which costs far more to pickle and read back
than one array of all the rows (`benchmarks.serve.bundle_path`). So when every entry's
items are arrays of one dtype and row shape (a stateless model's usual bundle), the bundle
goes as `Stacked`: the keys, ONE array of all the rows, the row count of each entry, their
priorities and timeouts; the answer to a `Stacked` bundle is `StackedOutcomes` when every
value is such an array too (errors travel beside them, by position). Anything else
(sequence controls, a block's count of requests, ragged or named inputs, values that are
not arrays) goes as a list of entries and is answered as a list: each side reads both, so
a caller that sends lists gets lists. Unpacking gives views of the one array, no copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from batching.errors import InvalidRequest, RaybatchError, portable
from batching.sequence.batcher import SequenceRequest
from batching.types import Request
from deployments.protocol.wording import generative_only, no_correlation_id, one_item_per_sequence

MIN_ENTRIES = 2  # a bundle of one gains nothing from stacking


class Entry(NamedTuple):
    """One request on the wire, from the ingress (or a `RaybatchClient`) to the engine.
    A tuple (it pickles as one), read by name."""

    key: Any  # the caller's id of it; its outcome comes back under it
    items: Any  # the model's items (an array with a batch dim, a TensorBatch, a list)
    priority: Any = None
    timeout_s: float | None = None  # what is left of it when it left (`deployments.wire.transit`)
    control: tuple[Any, bool, bool] | None = None  # a sequence's (sequence_id, start, end)
    requests: int = 1  # the clients' requests it stands for (a native-front block: several)


def entry(value: Any) -> Entry:
    """`value` as an `Entry` (a plain tuple of its fields is taken too); InvalidRequest
    for anything else: what comes off the wire is checked here, once."""
    if type(value) is Entry:
        return value
    if type(value) is tuple and 2 <= len(value) <= len(Entry._fields):
        return Entry(*value)
    raise InvalidRequest(f"a bundle entry is (key, items, priority, timeout_s, control, "
                         f"requests); got {type(value).__name__}: build bundles with "
                         "deployments.ingress.coalesce or RaybatchClient")


@dataclass(slots=True)
class Stacked:
    """Entries (key, rows, priority, timeout_s) whose rows are `items[offset:offset+n]`:
    no sequence control, one request each."""

    keys: list[Any]
    items: np.ndarray
    counts: list[int]
    priorities: list[Any]
    timeouts: list[Any]

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(slots=True)
class StackedOutcomes:
    """`(key, value, error)` per entry: values are `values[offset:offset+n]` (n = 0 where
    `errors` has the entry's position)."""

    keys: list[Any]
    values: np.ndarray
    counts: list[int]
    errors: dict[int, BaseException]


def pack(bundle: list[Entry]) -> list[Entry] | Stacked:
    """`bundle` as `Stacked` when its entries are arrays of one dtype and row shape,
    carry no sequence control and stand for one request each; else as it is."""
    if len(bundle) < MIN_ENTRIES:
        return bundle
    first = bundle[0].items
    if type(first) is not np.ndarray or first.ndim == 0:
        return bundle
    dtype, row = first.dtype, first.shape[1:]
    for e in bundle:
        items = e.items
        if (type(items) is not np.ndarray or items.ndim == 0 or items.dtype != dtype
                or items.shape[1:] != row or e.control is not None or e.requests != 1):
            return bundle
    return Stacked([e.key for e in bundle], np.concatenate([e.items for e in bundle]),
                   [len(e.items) for e in bundle], [e.priority for e in bundle],
                   [e.timeout_s for e in bundle])


def entries(bundle: list[Entry] | Stacked) -> Iterator[Entry]:
    """The bundle's entries, either form; InvalidRequest for one that is not an entry."""
    if type(bundle) is not Stacked:
        if not isinstance(bundle, list):
            raise InvalidRequest(f"a bundle is a list of entries or Stacked; got "
                                 f"{type(bundle).__name__}")
        yield from map(entry, bundle)
        return
    if not (len(bundle.keys) == len(bundle.counts) == len(bundle.priorities)
            == len(bundle.timeouts)) or sum(bundle.counts) != len(bundle.items):
        raise InvalidRequest(f"a stacked bundle of {len(bundle.keys)} keys holds "
                             f"{len(bundle.counts)} row counts adding up to "
                             f"{sum(bundle.counts)} for {len(bundle.items)} rows: "
                             "build it with deployments.wire.bundles.pack")
    items, offset = bundle.items, 0
    for key, n, priority, timeout_s in zip(bundle.keys, bundle.counts, bundle.priorities,
                                           bundle.timeouts):
        yield Entry(key, items[offset:offset + n], priority, timeout_s)
        offset += n


def pack_outcomes(bundle: list[Entry] | Stacked,
                  outcomes: list[tuple]) -> list[tuple] | StackedOutcomes:
    """The answer to `bundle`: stacked if the bundle was and every value allows it."""
    if type(bundle) is not Stacked:
        return outcomes
    values, keys, counts, errors = [], [], [], {}
    dtype = row = None
    for i, (key, value, error) in enumerate(outcomes):
        keys.append(key)
        if error is not None:
            errors[i] = error
            counts.append(0)
            continue
        if type(value) is not np.ndarray or value.ndim == 0:
            return outcomes
        if dtype is None:
            dtype, row = value.dtype, value.shape[1:]
        elif value.dtype != dtype or value.shape[1:] != row:
            return outcomes
        values.append(value)
        counts.append(len(value))
    if not values:
        return outcomes
    return StackedOutcomes(keys, np.concatenate(values), counts, errors)


def outcomes(answer: list[tuple] | StackedOutcomes) -> Iterator[tuple]:
    """`(key, value, error)` per entry of an answer, either form."""
    if type(answer) is not StackedOutcomes:
        yield from answer
        return
    values, errors, offset = answer.values, answer.errors, 0
    for i, (key, n) in enumerate(zip(answer.keys, answer.counts)):
        error = errors.get(i)
        if error is not None:
            yield key, None, error
        else:
            yield key, values[offset:offset + n], None
            offset += n


def submit_entry(host: Any, kind: str, model: str, request_id: int, entry: Entry) -> asyncio.Future:
    """Hand one entry to `host` (a model's engine host, of `kind`) as the engine request it
    stands for; its future. Raises the request's error (InvalidRequest, QueueFull,
    UnknownSequence...) at once. The route checked the same at the ingress, in the same
    words (`deployments.protocol.wording`); this holds for a caller that skipped it."""
    items, control = entry.items, entry.control
    if kind == "sequence":
        if control is None:
            raise InvalidRequest(no_correlation_id(model))
        if len(items) != 1:
            raise InvalidRequest(one_item_per_sequence(model, len(items)))
        sequence_id, start, end = control
        return host.submit(SequenceRequest(request_id, sequence_id, items[0], bool(start),
                                           bool(end), entry.timeout_s))
    if kind == "iterative":
        raise InvalidRequest(generative_only(model))
    return host.submit(Request(request_id, items, False, entry.priority, entry.timeout_s,
                               len(items), entry_requests(entry)))


def entry_requests(entry: Entry) -> int:
    """The clients' requests a bundle entry stands for (a block of the native front's:
    several), as the engine counts them; 1 where the wire said nonsense."""
    n = entry.requests
    return n if type(n) is int and n > 0 else 1


def outcome(key: Any, fut: asyncio.Future) -> tuple[Any, Any, BaseException | None]:
    """A bundle entry's answer, `(key, value, error)`, from its ended future; errors that
    are not Raybatch's own travel as `portable` copies (they cross a Ray call)."""
    error = fut.exception()
    if error is None:
        return key, fut.result(), None
    return key, None, error if isinstance(error, RaybatchError) else portable(error)
