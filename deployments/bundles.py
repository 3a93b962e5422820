"""A bundle on the wire: one stacked array instead of one array per request.

A bundle (`deployments.coalesce`) carries up to a batch of requests to a batching actor
(or through the handle to an ingress-placed engine), and its answer carries one value per
request back. As a list of per-request tuples, every request's array is its own buffer
to Ray's serializer: pickling 64 arrays of 256 floats and reading them back costs ~290 us
a bundle here, one array of 64 rows ~18 us. So when every entry's items are arrays of one
dtype and row shape (a stateless model's usual bundle), the bundle goes as `Stacked`: the
keys, ONE array of all the rows, the row count of each entry, their priorities and
timeouts; the answer to a `Stacked` bundle is `StackedOutcomes` when every value is such
an array too (errors travel beside them, by position). Anything else (sequence controls,
ragged or named inputs, values that are not arrays) goes as before, a list of tuples, and
is answered as a list: each side reads both, so a caller that sends lists gets lists.
Unpacking gives views of the one array, no copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from batching.errors import InvalidRequest

MIN_ENTRIES = 2  # a bundle of one gains nothing from stacking


@dataclass(slots=True)
class Stacked:
    """Entries `(key, rows, priority, timeout_s)` whose rows are `items[offset:offset+n]`."""

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


def pack(bundle: list[tuple]) -> list[tuple] | Stacked:
    """`bundle` as `Stacked` when its entries are arrays of one dtype and row shape and
    carry no sequence control; else as it is."""
    if len(bundle) < MIN_ENTRIES:
        return bundle
    first = bundle[0][1]
    if type(first) is not np.ndarray or first.ndim == 0:
        return bundle
    dtype, row = first.dtype, first.shape[1:]
    for entry in bundle:
        items = entry[1]
        if (type(items) is not np.ndarray or items.ndim == 0 or items.dtype != dtype
                or items.shape[1:] != row or (len(entry) > 4 and entry[4] is not None)
                or len(entry) > 5):  # a block's count of requests: sent as it is
            return bundle
    return Stacked([e[0] for e in bundle], np.concatenate([e[1] for e in bundle]),
                   [len(e[1]) for e in bundle], [e[2] for e in bundle],
                   [e[3] for e in bundle])


def entries(bundle: list[tuple] | Stacked) -> Iterator[tuple]:
    """The bundle's entries `(key, items, priority, timeout_s[, control])`, either form."""
    if type(bundle) is not Stacked:
        yield from bundle
        return
    if not (len(bundle.keys) == len(bundle.counts) == len(bundle.priorities)
            == len(bundle.timeouts)) or sum(bundle.counts) != len(bundle.items):
        raise InvalidRequest(f"a stacked bundle of {len(bundle.keys)} keys holds "
                             f"{len(bundle.counts)} row counts adding up to "
                             f"{sum(bundle.counts)} for {len(bundle.items)} rows: "
                             "build it with deployments.bundles.pack")
    items, offset = bundle.items, 0
    for key, n, priority, timeout_s in zip(bundle.keys, bundle.counts, bundle.priorities,
                                           bundle.timeouts):
        yield key, items[offset:offset + n], priority, timeout_s
        offset += n


def pack_outcomes(bundle: list[tuple] | Stacked,
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
