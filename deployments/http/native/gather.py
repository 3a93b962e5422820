"""Gathering the native front's requests into full blocks while a model is busy.

Where a model's engine is a batching actor, each block the front's requests make is one
engine request there and, most often, one Ray call: its cost is per block, not per
request. Python wakes for whatever arrived since it last looked, so at a few thousand
requests a second a block holds a few requests, and the call and the actor's work per
entry are paid a few requests at a time. So, per model, while this replica already has
at least a full batch of it in flight (`batch` requests), new arrivals wait here to fill
a block: they could not start before that batch ends anyway. They go on once a block is
full, once the in-flight work falls below a batch (a block came back), or once the
oldest has waited the model's own `max_queue_delay_s` (`delay_s`): the wait it already
accepts for a fuller batch. With less than a batch in flight nothing waits (a lone
request pays nothing), and a delay of 0 turns gathering off. Pure: handed `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Gather:
    """One model's gathering: what this replica has in flight and what waits for it.

    >>> g = Gather(batch=4, delay_s=0.002)
    >>> g.sent(4); g.holds()
    True
    >>> g.hold(plan=0, part="a", n=3, now=1.0); g.due_s
    1.002
    >>> g.answered(4); g.holds(), g.take()
    (False, [(0, ['a'])])
    """

    batch: int  # requests of a full batch
    delay_s: float  # the longest an arrival waits here
    inflight: int = 0  # requests sent and not answered yet
    held: dict[int, list[Any]] = field(default_factory=dict)  # plan -> parts, in order
    counts: dict[int, int] = field(default_factory=dict)  # plan -> requests held
    due_s: float = math.inf  # when the oldest held request has waited `delay_s`

    def holds(self) -> bool:
        """Do arrivals wait now (a full batch in flight, and a delay to wait)?"""
        return self.delay_s > 0 and self.inflight >= self.batch

    @property
    def waiting(self) -> int:
        return sum(self.counts.values())

    def hold(self, plan: int, part: Any, n: int, now: float) -> int:
        """Keep `n` requests of `plan` (`part`); returns how many of that plan wait."""
        if not self.counts:
            self.due_s = now + self.delay_s
        self.held.setdefault(plan, []).append(part)
        self.counts[plan] = count = self.counts.get(plan, 0) + n
        return count

    def take(self, plan: int | None = None) -> list[tuple[int, list[Any]]]:
        """What waits (of `plan`, or all), in arrival order per plan; nothing waits after."""
        plans = list(self.held) if plan is None else [plan] if plan in self.held else []
        out = [(p, self.held.pop(p)) for p in plans]
        for p in plans:
            del self.counts[p]
        if not self.counts:
            self.due_s = math.inf
        return out

    def drop(self, plan: int, mine: Any, size: int) -> np.ndarray:
        """Forget the waiting requests of `plan` whose clients went away: parts are the
        front's (arrival records, payload of `size` bytes a request); `mine(tokens)` says
        which are gone. Returns their tokens."""
        parts, left, dropped = [], 0, []
        for rec, data in self.held.get(plan, []):
            gone = mine(rec["token"])
            if gone.any():
                dropped.append(rec["token"][gone])
                rows = np.frombuffer(data, np.uint8).reshape(len(rec), size)
                rec, data = rec[~gone], memoryview(rows[~gone].tobytes())
            if len(rec):
                parts.append((rec, data))
                left += len(rec)
        if not dropped:
            return np.empty(0, np.uint64)
        if left:
            self.held[plan], self.counts[plan] = parts, left
        else:
            del self.held[plan], self.counts[plan]
            if not self.counts:
                self.due_s = math.inf
        return np.concatenate(dropped)

    def sent(self, n: int) -> None:
        self.inflight += n

    def answered(self, n: int) -> None:
        self.inflight -= n


def connection_of(prefix: int) -> Any:
    """tokens -> which of them are of the connection whose tokens share `prefix` (a token
    shifted right by 24: its slot and generation, `_front.c`)."""
    shift, want = np.uint64(24), np.uint64(prefix)
    return lambda tokens: (tokens >> shift) == want
