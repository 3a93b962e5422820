"""Time in transit: a request's timeout counts from when it reached the server, hops included.

The ingress (or a `RaybatchClient` caller) hands its requests to a batching actor in a
Ray call, and the actor's engine sets each request's deadline from its timeout when that
call runs there. In between, the bundle waits: for the end of the coalescer's loop tick,
in Ray's transport, in the actor's event loop behind other calls. Milliseconds, usually;
seconds when the machine stalls (another process starting, swapping), and then an
accepted request would be answered late, past the timeout the engine was told it still
had. So the sender stamps each bundle (`stamp`), the actor takes the time since from
each request's timeout (`less_transit`), and a request whose timeout passed on the way
is refused as overloaded (429 with Retry-After: nothing of it ran, a retry is safe).

The clock is the node's monotonic one (`CLOCK_MONOTONIC`, shared by every process of a
machine); across nodes no clock is shared to the millisecond, so a bundle from another
Ray node counts as sent when it arrived, as before.
"""

from __future__ import annotations

import math
import time

from batching.errors import Overloaded
from deployments.wire.bundles import Entry

Stamp = tuple[str, float]  # (Ray node id, time.monotonic() there)
_node: list[str | None] = []  # this process's Ray node id, once known


def node_id() -> str | None:
    """This process's Ray node id; None outside Ray (tests, a plain process)."""
    if not _node:
        import ray

        if not ray.is_initialized():
            return None
        _node.append(ray.get_runtime_context().get_node_id())
    return _node[0]


def stamp() -> Stamp | None:
    """What a sender attaches to a bundle: where and when it left."""
    node = node_id()
    return None if node is None else (node, time.monotonic())


def in_transit_s(sent: Stamp | None) -> float:
    """Seconds since `sent` (0 if it came from another node, unstamped, or is not a stamp:
    a caller of the actor's API that sends something else loses nothing by it)."""
    if (type(sent) is not tuple or len(sent) != 2 or sent[0] != node_id()
            or type(sent[1]) is not float or not math.isfinite(sent[1])):
        return 0.0
    return max(time.monotonic() - sent[1], 0.0)


def less_transit(entry: Entry, transit_s: float) -> Entry:
    """A bundle entry with `transit_s` taken from its timeout; Overloaded if none is left.
    No timeout: unchanged."""
    timeout_s = entry.timeout_s
    if not timeout_s or not transit_s:
        return entry
    left = timeout_s - transit_s
    if left <= 0:
        raise Overloaded(
            f"this request spent {transit_s:.2f} s reaching its batching actor, its whole "
            f"timeout of {timeout_s:.2f} s: the server is overloaded; retry later, or raise "
            "the timeout", retry_after_s=transit_s - timeout_s)
    return entry._replace(timeout_s=left)

