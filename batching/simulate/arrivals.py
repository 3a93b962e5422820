"""Arrival processes for the simulator: when clients send requests, in virtual seconds.

Open-loop processes (`Poisson`, `Bursts`, `Trace`) send whatever the system
does, as independent users do; a closed loop (`ClosedLoop`) sends a client's
next request only when its previous one ended, as a benchmark with C
concurrent clients does. Each process yields ascending times from a seeded
`numpy` generator it is handed, so a simulation repeats exactly under a seed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

MAX_BURST = 1_000_000  # a burst's times are drawn (and sorted) at once
MAX_TRACE = 2_000_000  # arrival times of a trace file (each at least one event of a run)
MAX_LINE = 1024  # characters of a trace file's line


class Arrivals(Protocol):
    """When requests are sent: `times` (ascending), and `after_end` to close the loop."""

    finite: bool  # `times` ends by itself: no duration or request count is needed

    def times(self, rng: np.random.Generator) -> Iterator[float]: ...

    def after_end(self, end_s: float) -> float | None:
        """When the client whose request ended at `end_s` sends again; None: it does not."""


class _OpenLoop:
    finite = False

    def after_end(self, end_s: float) -> float | None:
        return None  # open loop: a response triggers nothing


@dataclass(frozen=True)
class Poisson(_OpenLoop):
    """Independent arrivals, `rate_per_s` on average (exponential gaps)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _check(0 < self.rate_per_s < math.inf, f"rate_per_s={self.rate_per_s} must be > 0 "
               "and finite")

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        t = 0.0
        while True:
            for gap in rng.exponential(1.0 / self.rate_per_s, 1024):
                t += float(gap)
                yield t


@dataclass(frozen=True)
class Bursts(_OpenLoop):
    """`size` requests every `period_s` from t=0, at once or spread uniformly over `spread_s`.

    >>> list(itertools.islice(Bursts(2, 0.5).times(np.random.default_rng(0)), 4))
    [0.0, 0.0, 0.5, 0.5]
    """

    size: int
    period_s: float
    spread_s: float = 0.0

    def __post_init__(self) -> None:
        _check(1 <= self.size <= MAX_BURST, f"burst size={self.size} must be 1..{MAX_BURST:,} "
               "(a burst's times are drawn at once)")
        _check(0 < self.period_s < math.inf,
               f"burst period_s={self.period_s} must be > 0 and finite")
        _check(
            0 <= self.spread_s <= self.period_s,
            f"spread_s={self.spread_s} must lie in [0, period_s={self.period_s}]",
        )

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        for k in itertools.count():
            offsets: Iterable[float] = itertools.repeat(0.0, self.size)
            if self.spread_s:
                offsets = np.sort(rng.uniform(0.0, self.spread_s, self.size)).tolist()
            for offset in offsets:
                yield k * self.period_s + offset


@dataclass(frozen=True)
class Trace(_OpenLoop):
    """Recorded arrival times, seconds from the start of the simulation (sorted here).

    >>> Trace((0.2, 0.1)).times_s
    (0.1, 0.2)
    """

    times_s: tuple[float, ...]
    finite = True

    def __post_init__(self) -> None:
        times = tuple(sorted(float(t) for t in self.times_s))
        _check(bool(times), "the trace has no arrival times: give at least one")
        bad = next((t for t in times if not math.isfinite(t)), None)
        _check(bad is None, f"trace time {bad} is not a finite number of seconds")
        _check(times[0] >= 0, f"trace time {times[0]} is negative: give seconds from the start")
        object.__setattr__(self, "times_s", times)

    @classmethod
    def from_file(cls, path: str | Path) -> Trace:
        """One arrival time (seconds) per line; blank lines and `#` comments are skipped.
        Read a line at a time, each at most `MAX_LINE` characters, at most `MAX_TRACE`
        times: a file that is not a trace (`/dev/zero`, a binary) is refused, not read
        into memory whole."""
        times: list[float] = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), ""), 1):
                if len(line) > MAX_LINE:
                    raise ValueError(f"{path}:{number}: a line of more than {MAX_LINE:,} "
                                     "characters: write one number of seconds per line")
                text = line.split("#", 1)[0].strip()
                if not text:
                    continue
                try:
                    times.append(float(text))
                    if not math.isfinite(times[-1]):
                        raise ValueError
                except ValueError:
                    raise ValueError(f"{path}:{number}: {text[:40]!r} is not a time: write one "
                                     "number of seconds per line") from None
                if len(times) > MAX_TRACE:
                    raise ValueError(f"{path} holds more than {MAX_TRACE:,} arrival times, more "
                                     "than one run can simulate: cut the trace")
        return cls(tuple(times))

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        return iter(self.times_s)


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` clients, all starting at t=0; each sends again `think_s` after a response."""

    concurrency: int
    think_s: float = 0.0
    finite = False

    def __post_init__(self) -> None:
        _check(self.concurrency >= 1, f"concurrency={self.concurrency} must be >= 1")
        _check(0 <= self.think_s < math.inf, f"think_s={self.think_s} must be >= 0 and finite")

    def times(self, rng: np.random.Generator) -> Iterator[float]:
        return itertools.repeat(0.0, self.concurrency)

    def after_end(self, end_s: float) -> float | None:
        return end_s + self.think_s


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
