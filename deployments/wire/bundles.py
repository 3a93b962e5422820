"""A bundle on the wire: typed entries, and one stacked array instead of one per request.

A bundle (`deployments.ingress.coalesce`) carries up to a batch of requests to a batching actor
(or through the handle to an ingress-placed engine), each one `Entry`, and its answer
carries one `Outcome` (key, value, error) per request back. As a list of entries, every request's
array is its own buffer to Ray's serializer, which costs far more to pickle and read back
than one array of all the rows (`benchmarks.serve.bundle_path`). So when every entry's
items are arrays of one dtype and row shape (a stateless model's usual bundle), the bundle
goes as `Stacked`: the keys, ONE array of all the rows, the row count of each entry, their
priorities and deadlines; the answer to a `Stacked` bundle is `StackedOutcomes` when every
value is such an array too (errors travel beside them, by position). Anything else
(sequence controls, a block's count of requests, ragged or named inputs, values that are
not arrays) goes as a list of entries and is answered as a list: each side reads both, so
a caller that sends lists gets lists. Unpacking gives views of the one array, no copy.

Time: an entry carries one absolute deadline, set once where the request came in
(`deployments.ingress.route`: when it was received plus its timeout), never a timeout
taken down again at every hop. It is an instant of the sender's monotonic clock
(`CLOCK_MONOTONIC`, shared by every process of a machine), so the time a bundle spends on
its way (the coalescer's tick, Ray's transport, the receiver's event loop behind other
calls; seconds when the machine stalls) counts against it without anyone measuring it.
Each bundle carries its sender's stamp (`stamp`: node, clock), and the receiver converts
each deadline once, on arrival (`Arrival`): from its own node, as it is; from another node,
whose clock it does not share, as the same time left after the stamp but from now (the
transit counted as none); unstamped, as it is. A request whose deadline passed on the way
is refused as overloaded (429 with Retry-After: nothing of it ran, a retry is safe). The
engine is handed what is left of it (`submit_entry`) as its timeout.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from batching.errors import InvalidRequest, Overloaded, RaybatchError, portable
from batching.sequence.batcher import SequenceRequest
from batching.types import Request
from deployments.protocol.wording import generative_only, no_correlation_id, one_item_per_sequence

MIN_ENTRIES = 2  # a bundle of one gains nothing from stacking
Stamp = tuple[str, float]  # (Ray node id, time.monotonic() there)
_node: list[str | None] = []  # this process's Ray node id, once known


class Entry(NamedTuple):
    """One request on the wire, from the ingress (or a `RaybatchClient`) to the engine.
    A tuple (it pickles as one), read by name."""

    key: Any  # the caller's id of it; its outcome comes back under it
    items: Any  # the model's items (an array with a batch dim, a TensorBatch, a list)
    priority: Any = None
    deadline: float | None = None  # time.monotonic() by which it ends, on the sender's node
    control: tuple[Any, bool, bool] | None = None  # a sequence's (sequence_id, start, end)
    requests: int = 1  # the clients' requests it stands for (a native-front block: several)


def entry(value: Any) -> Entry:
    """`value` as an `Entry` (a plain tuple of its fields is taken too, if it carries no
    time: a number in a plain tuple's fourth place may be a caller's timeout of before the
    deadline, and is refused rather than read as an instant); InvalidRequest for anything
    else: what comes off the wire is checked here, once."""
    if type(value) is Entry:
        return value
    if type(value) is tuple and 2 <= len(value) <= len(Entry._fields):
        if len(value) > 3 and value[3] is not None:
            raise InvalidRequest(
                f"a bundle entry's fourth field is its deadline, an instant of the sender's "
                f"time.monotonic(), not a timeout; a plain tuple may not carry one (got "
                f"{value[3]!r}): build it as deployments.wire.bundles.Entry(key, items, "
                "priority, deadline=...) and send the bundle with its stamp()")
        return Entry(*value)
    raise InvalidRequest(f"a bundle entry is (key, items, priority, deadline, control, "
                         f"requests); got {type(value).__name__}: build bundles with "
                         "deployments.ingress.coalesce or RaybatchClient")


@dataclass(slots=True)
class Stacked:
    """Entries (key, rows, priority, deadline) whose rows are `items[offset:offset+n]`:
    no sequence control, one request each."""

    keys: list[Any]
    items: np.ndarray
    counts: list[int]
    priorities: list[Any]
    deadlines: list[Any]

    def __len__(self) -> int:
        return len(self.keys)


class Outcome(NamedTuple):
    """One request's answer on the wire, back from the engine: under the key its entry
    came with, the value, or the error that ended it. A tuple (it pickles as one), read
    by name."""

    key: Any
    value: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class StackedOutcomes:
    """An `Outcome` per entry: values are `values[offset:offset+n]` (n = 0 where
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
                   [e.deadline for e in bundle])


def entries(bundle: list[Entry] | Stacked) -> Iterator[Entry]:
    """The bundle's entries, either form; InvalidRequest for one that is not an entry,
    before the first is read (none of a refused bundle is opened)."""
    if type(bundle) is not Stacked:
        if not isinstance(bundle, list):
            raise InvalidRequest(f"a bundle is a list of entries or Stacked; got "
                                 f"{type(bundle).__name__}")
        yield from [entry(value) for value in bundle]
        return
    if not (len(bundle.keys) == len(bundle.counts) == len(bundle.priorities)
            == len(bundle.deadlines)) or sum(bundle.counts) != len(bundle.items):
        raise InvalidRequest(f"a stacked bundle of {len(bundle.keys)} keys holds "
                             f"{len(bundle.counts)} row counts adding up to "
                             f"{sum(bundle.counts)} for {len(bundle.items)} rows: "
                             "build it with deployments.wire.bundles.pack")
    items, offset = bundle.items, 0
    for key, n, priority, deadline in zip(bundle.keys, bundle.counts, bundle.priorities,
                                          bundle.deadlines):
        yield Entry(key, items[offset:offset + n], priority, deadline)
        offset += n


def pack_outcomes(bundle: list[Entry] | Stacked,
                  outcomes: list[Outcome]) -> list[Outcome] | StackedOutcomes:
    """The answer to `bundle`: stacked if the bundle was and every value allows it."""
    if type(bundle) is not Stacked:
        return outcomes
    values, keys, counts, errors = [], [], [], {}
    dtype = row = None
    for i, o in enumerate(outcomes):
        keys.append(o.key)
        value = o.value
        if o.error is not None:
            errors[i] = o.error
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


def outcomes(answer: list[Outcome] | StackedOutcomes) -> Iterator[Outcome]:
    """An `Outcome` per entry of an answer, either form (a plain `(key, value, error)`
    tuple is read as one)."""
    if type(answer) is not StackedOutcomes:
        for o in answer:
            yield o if type(o) is Outcome else Outcome(*o)
        return
    values, errors, offset = answer.values, answer.errors, 0
    for i, (key, n) in enumerate(zip(answer.keys, answer.counts)):
        error = errors.get(i)
        if error is not None:
            yield Outcome(key, None, error)
        else:
            yield Outcome(key, values[offset:offset + n])
            offset += n


# -- time: one deadline, converted once where it lands ------------------------------------
def node_id() -> str | None:
    """This process's Ray node id; None outside Ray (tests, a plain process)."""
    if not _node:
        import ray

        if not ray.is_initialized():
            return None
        _node.append(ray.get_runtime_context().get_node_id())
    return _node[0]


def stamp() -> Stamp | None:
    """What a sender attaches to a bundle: its node, and its monotonic clock as it leaves."""
    node = node_id()
    return None if node is None else (node, time.monotonic())


class Arrival:
    """A bundle's deadlines on this node's clock, read once as it arrives; `sent`: its
    sender's stamp. From this node: as they are. From another node (no clock shared), or
    stamped ahead of this clock: what each had left when the bundle left, from `now` (the
    transit counted as none). Unstamped (a caller outside Ray; not a stamp): as they are."""

    __slots__ = ("now", "sent_at", "shift")

    def __init__(self, sent: Stamp | None, now: float | None = None) -> None:
        self.now = now = time.monotonic() if now is None else now
        self.sent_at: float | None = None  # when it left, if sent on this clock
        self.shift = 0.0  # the sender's instant + shift = this clock's
        if (type(sent) is tuple and len(sent) == 2 and type(sent[0]) is str
                and type(sent[1]) is float and math.isfinite(sent[1])):
            if sent[0] == node_id() and sent[1] <= now:
                self.sent_at = sent[1]
            else:
                self.shift = now - sent[1]

    def entry(self, entry: Entry) -> Entry:
        """`entry` with its deadline on this clock; Overloaded if that has passed,
        InvalidRequest if it is not an instant."""
        deadline = entry.deadline
        if deadline is None:
            return entry
        local = self.instant(deadline)
        return entry if local == deadline else entry._replace(deadline=local)

    def instant(self, deadline: Any) -> float:
        """A sender's deadline on this clock; Overloaded if it has passed, InvalidRequest
        if it is not an instant."""
        if type(deadline) not in (float, int) or not math.isfinite(deadline):
            raise InvalidRequest(f"a bundle entry's deadline is an instant of "
                                 f"time.monotonic() or None; got {deadline!r}")
        local, now = deadline + self.shift, self.now
        if local > now:
            return local
        retry = now - local
        sent_at = self.sent_at
        if sent_at is None:
            raise Overloaded(f"this request reached its batching actor {retry:.2f} s past its "
                             "deadline: the server is overloaded; retry later, or raise the "
                             "timeout", retry_after_s=retry)
        raise Overloaded(
            f"this request spent {now - sent_at:.2f} s reaching its batching actor, past the "
            f"{max(local - sent_at, 0.0):.2f} s left of its timeout when it was sent: the "
            "server is overloaded; retry later, or raise the timeout", retry_after_s=retry)


def time_left(deadline: float | None, now: float | None = None) -> float | None:
    """What is left until `deadline` (this node's clock), as an engine request's timeout;
    None: no deadline. Overloaded if nothing is (the engine takes no timeout of 0)."""
    if deadline is None:
        return None
    left = deadline - (time.monotonic() if now is None else now)
    if left > 0:
        return left
    raise Overloaded(f"this request's deadline passed {-left:.2f} s before its engine took "
                     "it: the server is overloaded; retry later, or raise the timeout",
                     retry_after_s=-left)


def submit_entry(host: Any, kind: str, model: str, request_id: int, entry: Entry) -> asyncio.Future:
    """Hand one entry to `host` (a model's engine host, of `kind`) as the engine request it
    stands for, its deadline (on this node's clock: `Arrival`) as the time left then; its
    future. Raises the request's error (InvalidRequest, QueueFull, UnknownSequence,
    Overloaded...) at once. The route checked the same at the ingress, in the same words
    (`deployments.protocol.wording`); this holds for a caller that skipped it."""
    items, control = entry.items, entry.control
    if kind == "sequence":
        if control is None:
            raise InvalidRequest(no_correlation_id(model))
        if len(items) != 1:
            raise InvalidRequest(one_item_per_sequence(model, len(items)))
        sequence_id, start, end = control
        return host.submit(SequenceRequest(request_id, sequence_id, items[0], bool(start),
                                           bool(end), time_left(entry.deadline)))
    if kind == "iterative":
        raise InvalidRequest(generative_only(model))
    return host.submit(Request(request_id, items, False, entry.priority,
                               time_left(entry.deadline), len(items), entry_requests(entry)))


def entry_requests(entry: Entry) -> int:
    """The clients' requests a bundle entry stands for (a block of the native front's:
    several), as the engine counts them; 1 where the wire said nonsense."""
    n = entry.requests
    return n if type(n) is int and n > 0 else 1


def outcome(key: Any, fut: asyncio.Future) -> Outcome:
    """A bundle entry's answer from its ended future; errors that are not Raybatch's own
    travel as `portable` copies (they cross a Ray call)."""
    error = fut.exception()
    if error is None:
        return Outcome(key, fut.result())
    return Outcome(key, None, error if isinstance(error, RaybatchError) else portable(error))
