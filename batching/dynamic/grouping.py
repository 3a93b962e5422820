"""Grouping by length: which queued requests share a batch when items are ragged.

A batch of ragged items is padded to its longest item, so a batch that mixes a
500-token request with 63 short ones computes 64 long ones. With
`group_by_length`, a batch still starts with the request the plain order would
send first (the anchor: highest level, earliest deadline, oldest), so nothing
waits longer than it would behind requests of its own length; its batch-mates
are then the queued requests of the same level closest to it in length, taken
so that the batch's range of lengths grows as little as possible each time.
Only the first `window` requests of the level (in service order) are looked at,
which bounds the cost of forming a batch to O(window log window).

Invariant: the order is a permutation of the window's live entries with the
anchor first; the caller decides how much of each it takes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from batching.dynamic.queues import Entry, LevelQueue


def by_length(queue: LevelQueue, window: int) -> Iterator[Entry]:
    """The anchor, then the window's other requests nearest to the batch's lengths."""
    anchor = queue.head()
    if anchor is None:
        return
    live = heapq.nsmallest(window, (t for t in queue.live if not t[2].removed))
    candidates = [t[2] for t in live]
    candidates += [e for e in queue.delayed if not e.removed][: max(window - len(live), 0)]
    if anchor not in candidates:
        candidates.append(anchor)
    ordered = sorted(candidates, key=lambda e: (e.length, e.seq))
    at = ordered.index(anchor)
    lo = hi = at
    low_len = high_len = anchor.length
    yield anchor
    while lo > 0 or hi < len(ordered) - 1:
        left = ordered[lo - 1] if lo > 0 else None
        right = ordered[hi + 1] if hi < len(ordered) - 1 else None
        # Take the side that widens the batch's length range least; ties go to the older.
        grow_left = low_len - left.length if left is not None else float("inf")
        grow_right = right.length - high_len if right is not None else float("inf")
        if right is None or (left is not None and (grow_left, left.seq) <= (grow_right,
                                                                            right.seq)):
            lo -= 1
            low_len = left.length
            yield left
        else:
            hi += 1
            high_len = right.length
            yield right
