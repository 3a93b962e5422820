"""Admission by time: refuse at once what would wait too long or end past its deadline.

Wait bound (`max_queue_wait_s`): a request is refused at submit with `Overloaded` (429,
Retry-After: when enough has drained for it to fit) only when its predicted wait, the
work in flight and queued ahead of it in full batches, each taking a replica's share of
a batch's time, exceeds the bound, or its own deadline if that is sooner. A
burst the replicas can serve inside the bound is accepted whatever its size (the queue's
count bound is then only a memory guard, far above). A batch's share of time is, best
first: the measured service rate below (the wait then adds twice the measured spread of
that many batches' times, so that batches running a little slow do not carry the last
request accepted past the bound); the latency model's prediction for a full batch
over the replicas (the host seeds it with the replicas' warm-up batches, so it has data
before the first request); with neither, `COLD_BATCH_S` per batch over the replicas.
What is accepted is served in the queues' order (priority, earliest deadline; a higher
level arriving later still goes first), unless the measured service slows after it was
accepted (on a shared machine, refusing an overload takes CPU the replicas had) so
that it would start past its arrival plus the bound: then it is shed before it runs
with the same error, as with deadlines below (judged on the mean time alone: the
spread is a margin at the door; and what was accepted before any batch was measured,
only once the rate rests on a few groups of samples, since the first ones are often
taken while the host reads the burst itself).

Deadlines (`deadline_admission`): a bounded queue alone still lets an accepted request
wait for the whole queue, and under overload its deadline passes in the queue (a 504
after a full timeout, the worst answer a client can get). So the engine measures how
fast its replicas drain work while they are kept busy (`ServiceRate`, cost per second),
and predicts when a request would finish: now + (work in flight + work served before it
+ its own) / rate. A request predicted to finish past its deadline is refused at submit
with `Overloaded` (HTTP 429, Retry-After: when that much work has drained); one already
queued whose prediction no longer makes it (the rate dropped: a replica died, the first
measurement came after a burst) is shed with the same error before it runs. Either way
nothing ran, so a retry is safe; and what is accepted and kept finishes within its
deadline as far as the measured rate holds (if it does not, the queue deadline still
ends it with DeadlineExceeded before it runs).

The rate: each batch that left full (`max_batch_size` items or `max_batch_cost`)
and completed while work was in flight, or a full batch queued, ever since the previous
completion (or since it was sent, after an idle spell) is one sample, its cost over that
time (so a host slow to send what is queued, e.g. an event loop busy answering, is
measured as the slower service it is); samples are taken in groups of one per replica
(replicas in parallel finish in whatever phase they keep: two close together, then a
gap), and the rate is the exponentially weighted mean of the groups' cost over time (the
first sample gives one at once); their weighted mean absolute deviation is the spread
the wait bound adds. Batches sent half empty
(light load) say how much work there was, not how much could be done: they are not
samples. Until the first sample the deadline checks predict nothing (the wait bound
has its fallbacks). Pure: every call is handed `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batching.dynamic.queues import Entry, LevelQueue
from batching.errors import Overloaded
from batching.latency import LatencyModel

_WEIGHT = 0.2  # of the newest sample in the weighted means
# The time of one full batch assumed before any batch was timed: with a 1 s bound, 10
# full batches per replica may wait, about the count bound used by default before
# (8 batches per replica). Conservative for fast models (their first batches come back
# in milliseconds and replace it), optimistic only for models slower than this.
COLD_BATCH_S = 0.1
SPREAD_MARGIN = 2.0
"""How many measured spreads of the batches' time a predicted wait adds (see `wait_s`)."""
UNSEEN_S = 0.005
"""What a predicted wait adds for the time of a request that the engine does not see:
its reading before it is queued, its answer's way back to the client. The bound is then
one on what a client sees, at most the bound and its own batch: without it, a request
accepted at the bound's edge under overload ended past the bound and a batch
(`benchmarks.serve.admission_overload`; the figures are in docs/performance.md)."""
SETTLED_GROUPS = 4
"""Groups of samples the rate rests on before the wait bound sheds a request accepted
before the rate was measured (on the latency model's prediction; it refuses at the door
from the first sample). The first samples of a service's life often span its first burst
being read, and time the first full batches many times slower than the ones after;
shedding on those first samples dropped requests of a burst that was served well within
the bound (`tests/e2e/test_burst_admission.py`)."""
WALK_GAP_PER_ENTRY_S = 30e-6
"""Under overload (the queue holds about the wait bound of work, so `Admission._none_due`
cannot rule shedding out), `shed` walks the queue at most once per this much time for each
entry it holds, so the walks take a small, fixed share of a core however deep the queue
(`benchmarks.serve.admission_overload`); shedding is that much late at most, never more
than a quarter of the bound."""


@dataclass(slots=True)
class ServiceRate:
    """Cost per second the replicas drain while kept busy, measured from completions.

    >>> r = ServiceRate()
    >>> r.sent(now=0.0, idle=True)
    >>> r.completed(now=0.5, cost=4, full=True, busy=True)
    >>> r.completed(now=1.0, cost=4, full=True, busy=False)
    >>> r.per_s
    8.0
    """

    _cost: float = 0.0  # weighted mean cost of a sample (a full batch)
    _unit_s: float = 0.0  # weighted mean seconds per unit of cost (of groups, see below)
    _dev_s: float = 0.0  # weighted mean absolute deviation of a group's seconds per unit
    samples: int = 0
    _since: float | None = None  # start of the busy stretch the next sample measures
    _group_s: float = 0.0  # the samples of the group under way: their seconds,
    _group_cost: float = 0.0  # ... their cost,
    _group_n: int = 0  # ... and how many
    _groups: int = 0  # whole groups measured
    known_since_s: float = math.inf  # when the first sample was taken

    @property
    def known(self) -> bool:
        return self.samples > 0 and self._unit_s > 0 and self._cost > 0

    @property
    def settled(self) -> bool:
        """The rate rests on `SETTLED_GROUPS` groups of samples (see there)."""
        return self._groups >= SETTLED_GROUPS

    @property
    def per_s(self) -> float:
        return 1.0 / self._unit_s if self.known else math.inf

    @property
    def spread_s(self) -> float:
        """How much one full batch's share of time strays from the mean (weighted mean
        absolute deviation of the groups in `completed`), in seconds."""
        return self._cost * self._dev_s if self.known else 0.0

    @property
    def batch_cost(self) -> float:
        """The cost of a full batch, as measured."""
        return self._cost

    def sent(self, now: float, idle: bool) -> None:
        """A batch left; `idle`: nothing was in flight before it (a busy stretch starts,
        unless one goes on: a full batch was queued when the last one came back, so the
        time until this one left was the host's, and counts)."""
        if idle and self._since is None:
            self._since = now

    def completed(self, now: float, cost: float, full: bool, busy: bool,
                  group: int = 1) -> None:
        """A batch of `cost` came back (`full`: it left full); `busy`: work is still in
        flight, so the next stretch starts now (else at the next `sent`); `group`: the
        replicas serving. Samples are taken in groups of one per replica: replicas in
        parallel finish in whatever phase they keep (two close together, then a gap),
        and the time of a group is what that phase does not bias."""
        since = self._since
        if full and cost > 0 and since is not None and now > since:
            if self.samples == 0:  # a rate at once (the first group replaces it)
                self._cost, self._unit_s = cost, (now - since) / cost
                self.known_since_s = now
            else:
                self._cost += _WEIGHT * (cost - self._cost)
            self._group_s += now - since
            self._group_cost += cost
            self._group_n += 1
            if self._group_n >= group:
                unit = self._group_s / self._group_cost
                if self._groups == 0:
                    self._unit_s = unit
                else:
                    self._dev_s += _WEIGHT * (abs(unit - self._unit_s) - self._dev_s)
                    self._unit_s += _WEIGHT * (unit - self._unit_s)
                self._groups += 1
                self._group_s = self._group_cost = 0.0
                self._group_n = 0
            self.samples += 1
        else:  # not a sample: the group under way is broken off
            self._group_s = self._group_cost = 0.0
            self._group_n = 0
        self._since = now if busy else None

    def failed(self, busy: bool, now: float) -> None:
        """A batch failed: no sample (a crash says nothing about the rate)."""
        self._since = now if busy else None
        self._group_s = self._group_cost = 0.0
        self._group_n = 0

    def finish_s(self, now: float, work: float, batch_s: float = 0.0) -> float:
        """When the last of `work` ends (cost: what is in flight, what is served before a
        request, the request itself): whole batches, in-flight ones counted whole (an upper
        bound), each taking a sample's mean time; plus, where replicas work in
        parallel (a sample's time is then a share of a batch's), what one batch takes
        beyond that share (`batch_s`: one batch's latency), since the last batch ends when
        its replica's batch does, not a share later."""
        cost = self._cost
        each_s = cost * self._unit_s
        batches = math.ceil(work / cost - 1e-9)
        return now + batches * each_s + max(batch_s - each_s, 0.0)


class Admission:
    """The admission checks of one engine: at submit (`check`) and on the queue (`shed`).
    `exempt[i]`: level i+1 lets expired requests run late (timeout_action=delay), so its
    deadlines bound nothing; `max_wait_s`: the wait bound (None: none); `deadlines`:
    deadline admission on; `full_cost`: the cost of a full batch (the policy's)."""

    def __init__(self, exempt: list[bool], latency: LatencyModel, *,
                 max_wait_s: float | None = None, deadlines: bool = True,
                 full_cost: float = 1.0) -> None:
        self.exempt = exempt
        self.rate = ServiceRate()
        self.latency = latency  # one batch's latency (for replicas in parallel)
        self.max_wait_s = max_wait_s
        self.deadlines = deadlines
        self.full_cost = full_cost
        self.walk_gap_per_entry_s = WALK_GAP_PER_ENTRY_S
        self._next_walk_s = -math.inf  # `shed` does not walk the queue before then
        # Requests refused or shed because the wait bound itself (not a request's own
        # shorter deadline) was reached: demand past what the replicas serve within it,
        # the signal the replica pool scales up on (`deployments.replica.pool`).
        self.wait_refusals = 0

    def _finish_s(self, now: float, work: float) -> float:
        rate = self.rate
        return rate.finish_s(now, work, self.latency.predict(rate.batch_cost))

    def batch_share(self, replicas: int) -> tuple[float, float, str]:
        """(cost of a full batch, seconds each full batch adds to a wait, where that comes
        from): measured while busy, else predicted by the latency model over `replicas`,
        else assumed (`COLD_BATCH_S` over `replicas`)."""
        rate, n = self.rate, max(replicas, 1)
        if rate.known:
            return rate.batch_cost, rate.batch_cost / rate.per_s, "measured"
        full = self.full_cost
        if self.latency.observed:
            return full, self.latency.predict(full) / n, "predicted"
        return full, COLD_BATCH_S / n, "assumed before any batch was timed"

    def wait_s(self, work: float, replicas: int, margin: bool = True) -> float:
        """Predicted wait of a request with `work` ahead of it (the cost in flight and
        queued before it): that work in full batches (it joins the one not full), each
        taking a batch's share of time, plus `SPREAD_MARGIN` times the measured spread of
        that many batches' times (independent strays add up as the square root of their
        number), so that the last request accepted at the bound still starts within it
        when batches run a little slow, as measured, plus `UNSEEN_S`. Batches
        in flight count by their cost: a half-empty one sent into a pipeline slot counts
        half, or a slow model's pipeline full of small batches would fill the bound and
        refuse what would make the next batches full (the prediction is exact again
        once they are, as under overload). `margin=False`: the mean alone, without the
        spread and `UNSEEN_S` (what shedding goes by, see `shed`)."""
        full, each_s, _ = self.batch_share(replicas)
        batches = math.floor(work / full + 1e-9)
        if batches == 0:
            return 0.0
        wait = batches * each_s
        if not margin:
            return wait
        return wait + SPREAD_MARGIN * self.rate.spread_s * math.sqrt(batches) + UNSEEN_S

    def check(self, entry: Entry, levels: list[LevelQueue], inflight_cost: float,
              cost: float, now: float, replicas: int = 1) -> None:
        """Raise Overloaded if `entry` (not queued yet) would wait past the wait bound (or
        its deadline, if sooner), or cannot finish by its deadline."""
        own = levels[entry.level - 1]
        ahead = sum(q.cost for q in levels[:entry.level])
        edf = entry.deadline_s < own.latest_deadline_s  # served before some of its level
        behind: float | None = None  # the cost of those (computed only when it matters)
        if self.max_wait_s is not None:
            bound = self.max_wait_s
            if not self.exempt[entry.level - 1]:
                bound = min(bound, entry.deadline_s - now)
            wait = self.wait_s(inflight_cost + ahead, replicas)
            if wait > bound and edf:
                behind = _behind(entry, own)
                wait = self.wait_s(inflight_cost + ahead - behind, replicas)
            if wait > bound:
                if bound == self.max_wait_s:
                    self.wait_refusals += 1
                raise self.wait_refusal(wait, bound, inflight_cost + ahead - (behind or 0.0),
                                        replicas)
        rate = self.rate
        if (not self.deadlines or entry.deadline_s == math.inf
                or self.exempt[entry.level - 1] or not rate.known):
            return
        work = inflight_cost + ahead + cost
        if self._finish_s(now, work) <= entry.deadline_s:
            return
        if edf:
            work -= _behind(entry, own) if behind is None else behind
            if self._finish_s(now, work) <= entry.deadline_s:
                return
        raise refusal(self._finish_s(now, work) - now, rate.per_s,
                      entry.deadline_s - entry.arrival_s)

    def wait_refusal(self, wait_s: float, bound_s: float, work: float,
                     replicas: int) -> Overloaded:
        """The error of a request that would wait `wait_s`, past `bound_s`."""
        full, each_s, basis = self.batch_share(replicas)
        batches = math.floor(work / full + 1e-9)
        what = (f"the bound of {bound_s:.2f} s (max_queue_wait_s)" if bound_s == self.max_wait_s
                else f"its timeout ({max(bound_s, 0.0):.2f} s left)")
        return Overloaded(
            f"the model is overloaded: this request would wait about {wait_s:.2f} s ("
            f"{batches} batches ahead of it, {each_s * 1e3:.1f} ms each over "
            f"{max(replicas, 1)} replica(s), {basis}), past {what}; retry later",
            retry_after_s=wait_s - bound_s)

    def shed(self, levels: list[LevelQueue], inflight_cost: float, now: float,
             replicas: int = 1) -> list[tuple[Entry, Overloaded]]:
        """The queued entries, in service order, that would now start past their arrival
        plus the wait bound (the service slowed after they were accepted, or the batches
        in flight were emptier than counted) or can no longer finish by their deadline,
        with the work ahead of each (what is shed no longer counts as ahead). The wait
        bound is judged on the mean prediction, without the spread the door adds, and a
        request accepted before the rate was measured only once it is `settled`: the
        margin kept the promise made at submit; breaking it (a request that has waited,
        then gets 429) is for a service that slowed past it on the mean, not for batches
        straying as measured, nor for a first measurement taken while the host was
        reading the burst it belongs to (see `SETTLED_GROUPS`)."""
        rate, bound = self.rate, self.max_wait_s
        if not rate.known or (bound is None and not self.deadlines):
            return []
        if self._none_due(levels, inflight_cost, now, replicas) or now < self._next_walk_s:
            return []
        queued = sum(q.count for q in levels)
        gap = queued * self.walk_gap_per_entry_s
        self._next_walk_s = now + (min(gap, bound / 4) if bound is not None else gap)
        out = []
        work, ahead = inflight_cost, 0.0
        # accepted on a prediction: judged once the measured rate is settled
        unjudged_s = -math.inf if rate.settled else rate.known_since_s
        for level, queue in enumerate(levels):
            for entry in queue.in_order():
                cost = entry.remaining_cost
                if (bound is not None and entry.offset == 0  # none of it is running
                        and entry.arrival_s >= unjudged_s):
                    wait_s = self.wait_s(inflight_cost + ahead, replicas, margin=False)
                    if now + wait_s > entry.arrival_s + bound + 1e-9:
                        self.wait_refusals += 1
                        out.append((entry, wait_shed_error(
                            entry.request.id, now - entry.arrival_s, wait_s, bound)))
                        continue
                work += cost
                ahead += cost
                if (not self.deadlines or self.exempt[level] or entry.deadline_s == math.inf
                        or entry.delayed):
                    continue
                end_s = self._finish_s(now, work)
                if end_s > entry.deadline_s:
                    work -= cost  # shed: it no longer counts as ahead of the rest
                    ahead -= cost
                    out.append((entry, shed_error(entry.request.id, now - entry.arrival_s,
                                                  end_s - now, rate.per_s,
                                                  entry.deadline_s - now)))
        return out

    def _none_due(self, levels: list[LevelQueue], inflight_cost: float, now: float,
                  replicas: int) -> bool:
        """True when no entry can be due for shedding, known in O(levels) instead of a
        walk of the whole queue in order (which `shed` runs at every dispatch decision):
        even with ALL the queued work ahead of it, the entry queued longest would start
        within its wait bound and the earliest deadline would be met. Every entry has at
        most that work ahead, arrived no earlier and has no earlier deadline, and waits
        and finish times only grow with the work ahead, so none would be shed. Only a
        shortcut: when it says no, `shed` walks the queue."""
        work = inflight_cost + sum(q.cost for q in levels)
        bound = self.max_wait_s
        if bound is not None:
            oldest = min(q.oldest_arrival() for q in levels)
            wait = self.wait_s(work, replicas, margin=False)
            if oldest != math.inf and now + wait > oldest + bound + 1e-9:
                return False
        if self.deadlines:
            earliest = min((q.earliest_deadline() for i, q in enumerate(levels)
                            if not self.exempt[i]), default=math.inf)
            if earliest != math.inf and self._finish_s(now, work) > earliest:
                return False
        return True


def _behind(entry: Entry, own: LevelQueue) -> float:
    """The cost queued at `entry`'s level that is served after it (later deadlines, and
    the delayed requests)."""
    key = (entry.deadline_s, entry.seq)
    return sum(e.remaining_cost for e in own.in_order()
               if e.delayed or (e.deadline_s, e.seq) > key)


def refusal(wait_s: float, per_s: float, timeout_s: float) -> Overloaded:
    """The error of a request refused at submit: it would end `wait_s` from now."""
    return Overloaded(
        f"the model is overloaded: this request would end in about {wait_s:.2f} s (the work "
        f"ahead of it drains at {per_s:.1f}/s), past its timeout of {timeout_s:.2f} s; "
        "retry later, or raise the timeout", retry_after_s=wait_s - timeout_s)


def shed_error(request_id: object, waited_s: float, wait_s: float, per_s: float,
               left_s: float) -> Overloaded:
    """The error of a queued request shed because it can no longer end in time."""
    return Overloaded(
        f"request {request_id!r} was shed after {waited_s * 1e3:.0f} ms in the queue, before "
        f"it ran: it would end in about {wait_s:.2f} s (the model drains {per_s:.1f}/s), past "
        f"its deadline in {max(left_s, 0.0):.2f} s; retry later, or raise the timeout",
        retry_after_s=wait_s - left_s)


def wait_shed_error(request_id: object, waited_s: float, wait_s: float,
                    bound_s: float) -> Overloaded:
    """The error of a queued request shed because the service slowed after it was
    accepted: it would start past its wait bound."""
    return Overloaded(
        f"request {request_id!r} was shed after {waited_s * 1e3:.0f} ms in the queue, before "
        f"it ran: the model slowed since it was accepted, and it would start in about "
        f"{wait_s:.2f} s more, past its wait bound of {bound_s:.2f} s (max_queue_wait_s); "
        "retry later", retry_after_s=waited_s + wait_s - bound_s)
