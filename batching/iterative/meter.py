"""`StepMeter`: what an `IterativeHost` measures of its steps and generations.

It turns the host's step events into the values of `batching.metrics` for the
recorder it was handed (one `BatchSent` per step sent, one `BatchDone` and one
`StepDone` per step back), and keeps the counts a metrics sampler reads through
the host's `snapshot()`: generations ended by outcome, tokens generated, and
the waits to join as bucket counts (for `raybatch status --watch`). The gap
between two steps of a replica is the inter-token latency of every sequence in
both; a replica's first step after idling has none. Never imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from batching.iterative.scheduler import Step
from batching.metrics import STEP, BatchDone, BatchSent, Recorder, StepDone, outcome_of
from batching.stats import WaitHistogram


class StepMeter:
    def __init__(self, recorder: Recorder, level_of: Callable[[int | None], int]) -> None:
        self.recorder = recorder
        self._level_of = level_of
        self.outcomes: dict[str, int] = {}  # generations ended, by outcome
        self.tokens_generated = 0
        self.join_waits = WaitHistogram()  # from submission to the step a request joins
        self._last_done_s: dict[Hashable, float] = {}  # replica key -> its last step back

    def ended(self, error: BaseException | None) -> None:
        """A generation ended (None: it finished)."""
        kind = outcome_of(error)
        self.outcomes[kind] = self.outcomes.get(kind, 0) + 1

    def sent(self, step: Step, now: float,
             joins: Iterable[tuple[float, int | None]]) -> None:
        """`step` left; `joins`: (submitted_s, priority) of each request joining in it."""
        joins = list(joins)
        waits = tuple(now - submitted_s for submitted_s, _ in joins)
        for wait in waits:
            self.join_waits.observe(wait)
        self.recorder.batch_sent(BatchSent(len(step.active), float(step.tokens), STEP, waits,
                                           tuple(self._level_of(p) for _, p in joins)))

    def done(self, step: Step, now: float, compute_s: float | None,
             first_text_s: tuple[float, ...] = (), tokens: int = 0) -> None:
        """`step` came back (`compute_s` None: it failed) with `tokens` generated."""
        previous = self._last_done_s.get(step.replica)
        self._last_done_s[step.replica] = now
        if not step.active:  # a leave-only step frees memory; it advances nothing
            return
        self.recorder.batch_done(BatchDone(len(step.active), now - step.created_s, compute_s))
        if compute_s is None:
            return
        self.tokens_generated += tokens
        again = previous is not None and len(step.active) > len(step.join)
        self.recorder.step_done(StepDone(tokens, first_text_s,
                                         now - previous if again else None))

    def forget(self, replica: Hashable) -> None:
        self._last_done_s.pop(replica, None)
