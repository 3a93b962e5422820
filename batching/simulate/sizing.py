"""Sizing a deployment with the simulator: sweep candidates over loads, pick one for a target.

A `Candidate` is what you would deploy: a `DynamicPolicy`, a replica count and
the deadline its clients send (`timeout_s`, None for none). A load is one level
of an arrival process (a rate for `Poisson`, a concurrency for `ClosedLoop`),
turned into arrivals by a function you pass. `sweep` simulates every
(candidate, load) pair with the same model and seed, so two curves differ only
by their candidates. `cheapest` answers "what should I deploy for p99 <= X ms
at this load?": of the candidates that meet the target there with nothing
failed or left unfinished, the one with the fewest replicas, then the lowest p99.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batching.dynamic.policy import DynamicPolicy
from batching.simulate.arrivals import Arrivals
from batching.simulate.engine import simulate
from batching.simulate.report import SimReport

_OWN = ("replicas", "timeout_s")  # simulate() settings a candidate decides


@dataclass(frozen=True)
class Candidate:
    """One configuration to try.

    >>> Candidate("delay 2 ms", DynamicPolicy(max_queue_delay_s=0.002), replicas=2).replicas
    2
    """

    name: str
    policy: DynamicPolicy
    replicas: int = 1
    timeout_s: float | None = None  # the deadline every request carries; None: no deadline


@dataclass(frozen=True)
class Point:
    """One simulation: a candidate at one load."""

    candidate: Candidate
    load: float
    report: SimReport

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def p50_ms(self) -> float:
        return _or_nan(self.report.latency_ms["p50"])

    @property
    def p99_ms(self) -> float:
        return _or_nan(self.report.latency_ms["p99"])

    @property
    def failed_share(self) -> float:
        """Requests of the window that ended with an error, as a share of those that arrived."""
        return sum(self.report.failed.values()) / max(self.report.arrived, 1)

    def meets(self, p99_ms: float) -> bool:
        """p99 within `p99_ms`, nothing failed and nothing left unfinished."""
        r = self.report
        return (r.completed > 0 and not r.failed and r.unfinished == 0
                and self.p99_ms <= p99_ms)


def sweep(
    candidates: Sequence[Candidate],
    loads: Sequence[float],
    arrivals: Callable[[float], Arrivals],
    **simulate_kwargs: Any,
) -> list[Point]:
    """Simulate each candidate at each load; points in candidate order, then load order.

    `simulate_kwargs` go to `simulate` (the model's `latency_a_s`, `latency_b_s`,
    `max_inflight`, `duration_s`, ...), except what a candidate decides.

    >>> from batching.simulate import Poisson
    >>> pts = sweep([Candidate("d0", DynamicPolicy(max_batch_size=8))], [100, 200], Poisson,
    ...             latency_a_s=0.002, latency_b_s=0.0, duration_s=1.0)
    >>> [(p.name, p.load) for p in pts]
    [('d0', 100), ('d0', 200)]
    """
    clash = sorted(set(_OWN) & set(simulate_kwargs))
    if clash:
        raise ValueError(f"{', '.join(clash)} belong to each Candidate, not to sweep(): "
                         "set them on the candidates")
    return [
        Point(c, load, simulate(c.policy, arrivals(load), replicas=c.replicas,
                                timeout_s=c.timeout_s, **simulate_kwargs))
        for c in candidates
        for load in loads
    ]


def curve(points: Sequence[Point], name: str) -> list[Point]:
    """The points of candidate `name`, by load."""
    out = sorted((p for p in points if p.name == name), key=lambda p: p.load)
    if not out:
        names = sorted({p.name for p in points})
        raise KeyError(f"no points of a candidate named {name!r}; there are {names}")
    return out


def cheapest(points: Sequence[Point], *, p99_ms: float, load: float) -> Point | None:
    """Of the points at `load` that meet `p99_ms`, the one with the fewest replicas,
    then the lowest p99; None if none does."""
    ok = [p for p in points if p.load == load and p.meets(p99_ms)]
    return min(ok, key=lambda p: (p.candidate.replicas, p.p99_ms), default=None)


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value
