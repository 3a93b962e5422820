"""IterativeScheduler step by step, one line per instant; then a property test driving it
with real Generators over random submit / cancel / complete / fail / kill schedules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.errors import (
    BatchSizeMismatch,
    DeadlineExceeded,
    InvalidRequest,
    QueueFull,
    ServiceClosed,
)
from batching.iterative.generative import Generator, StepModel
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest, IterativeScheduler, Join, StepOutput


def sched(*replicas, **policy) -> IterativeScheduler:
    s = IterativeScheduler(IterativePolicy(**policy))
    for r in replicas or ("r0",):
        s.add_replica(r)
    return s


def req(rid, prompt="ab", **kw) -> GenerateRequest:
    return GenerateRequest(rid, prompt, **kw)


def outs(step, done=(), text="x", reason="length") -> list[StepOutput]:
    """One output per active sequence of `step`; those in `done` finish with `reason`."""
    return [StepOutput(i, text, reason if i in done else None) for i in step.active]


def test_sequences_join_and_leave_at_step_boundaries():
    s = sched(max_active=4)
    s.submit(req("a"), now=0.0)
    s.submit(req("b", "xyz"), now=0.0)
    st0 = s.next_step(0.0, "r0")
    assert (st0.join, st0.active, st0.leave, st0.tokens) == (
        (Join("a", "ab", 64, ()), Join("b", "xyz", 64, ())), ("a", "b"), (), 5)
    s.submit(req("c"), now=0.1)  # arrives mid-step: waits for the boundary
    with pytest.raises(RuntimeError, match="in flight"):
        s.next_step(0.1, "r0")
    assert (s.waiting, s.active) == (1, 2)
    assert s.complete(st0.id, outs(st0, done={"a"}), now=0.2) == [
        StepOutput("a", "x", "length"), StepOutput("b", "x", None)]
    st1 = s.next_step(0.2, "r0")  # a finished and left (the Generator dropped it itself)
    assert (st1.active, [j.id for j in st1.join], st1.leave, st1.tokens) == (
        ("b", "c"), ["c"], (), 1 + 2)
    s.complete(st1.id, outs(st1, done={"b", "c"}), now=0.3)
    assert s.next_step(0.3, "r0") is None
    assert (s.waiting, s.active, s.stats.finished["length"]) == (0, 0, 3)


def test_no_more_than_max_active_per_replica():
    s = sched(max_active=2)
    for rid in "abc":
        s.submit(req(rid), now=0.0)
    st0 = s.next_step(0.0, "r0")
    assert st0.active == ("a", "b") and s.waiting == 1
    s.complete(st0.id, outs(st0), now=0.1)
    st1 = s.next_step(0.1, "r0")
    assert st1.active == ("a", "b") and st1.join == ()  # full: c keeps waiting
    s.complete(st1.id, outs(st1, done={"a"}), now=0.2)
    assert s.next_step(0.2, "r0").active == ("b", "c")  # a's slot goes to c at once


def test_the_token_budget_counts_each_joining_prompt_and_one_per_decoding_sequence():
    s = sched(max_active=8, max_step_tokens=10)
    s.submit(req("a", "aaaa"), 0.0)
    s.submit(req("b", "bbbbb"), 0.0)
    s.submit(req("c", "ccc"), 0.0)
    st0 = s.next_step(0.0, "r0")
    assert (st0.active, st0.tokens) == (("a", "b"), 9)  # c would make 12
    s.complete(st0.id, outs(st0), 0.1)
    st1 = s.next_step(0.1, "r0")
    assert (st1.active, st1.tokens) == (("a", "b", "c"), 2 + 3)


def test_a_prompt_that_does_not_fit_waits_and_nothing_behind_it_jumps_ahead():
    s = sched(max_active=8, max_step_tokens=10)
    s.submit(req("a", "a", prompt_tokens=1), 0.0)
    s.submit(req("b", "b", prompt_tokens=1), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.submit(req("big", "x" * 9), 0.1)
    s.submit(req("small", "y"), 0.1)
    s.complete(st0.id, outs(st0), 0.1)
    st1 = s.next_step(0.1, "r0")
    assert (st1.active, st1.tokens) == (("a", "b"), 2)  # 2 + 9 > 10; small waits behind big
    s.complete(st1.id, outs(st1, done={"a"}), 0.2)
    st2 = s.next_step(0.2, "r0")
    assert (st2.active, st2.tokens) == (("b", "big"), 1 + 9)  # budget now exactly spent
    s.complete(st2.id, outs(st2, done={"b"}), 0.3)
    assert s.next_step(0.3, "r0").active == ("big", "small")


def test_the_waiting_queue_is_served_by_priority_then_deadline_then_arrival():
    s = sched(max_active=1, priority_levels=2)
    s.submit(req("low"), 0.0)  # level 2, the default
    s.submit(req("late", priority=1), 0.0)  # level 1, no deadline
    s.submit(req("soon", priority=1, timeout_s=9.0), 0.1)  # level 1, a deadline: first
    s.submit(req("high", priority=1), 0.2)
    order = []
    for i in range(4):
        step = s.next_step(float(i), "r0")
        order += [j.id for j in step.join]
        s.complete(step.id, outs(step, done=set(step.active)), float(i))
    assert order == ["soon", "late", "high", "low"]


def test_a_request_whose_deadline_passes_while_waiting_fails_and_never_joins():
    s = sched(max_active=1, default_timeout_s=5.0)
    s.submit(req("a"), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.submit(req("b", timeout_s=1.0), 0.5)  # its own timeout lowers the default
    s.submit(req("c"), 0.5)
    assert s.deadline() == 1.5  # b's; a's deadline no longer counts once it joined
    s.complete(st0.id, outs(st0), 1.5)
    st1 = s.next_step(1.5, "r0")
    assert st1.active == ("a",)
    [failure] = s.take_failures()
    assert failure.request_id == "b" and isinstance(failure.error, DeadlineExceeded)
    assert "waited 1000.0 ms" in str(failure.error)
    assert s.deadline() == 5.5 and s.waiting == 1
    s.complete(st1.id, outs(st1, done={"a"}), 5.5)
    assert s.next_step(5.5, "r0") is None  # c expired at 5.5 before it could join
    assert [f.request_id for f in s.take_failures()] == ["c"] and s.deadline() is None


def test_cancel_frees_the_slot_at_the_next_step_and_drops_the_in_flight_output():
    s = sched(max_active=2)
    for rid in "abc":
        s.submit(req(rid), 0.0)
    st0 = s.next_step(0.0, "r0")
    assert s.cancel("c", 0.1) and s.waiting == 0  # a waiting one just ends
    s.submit(req("d"), 0.1)
    assert s.cancel("a", 0.1) and not s.cancel("a", 0.1)  # active: leaves next step
    assert s.complete(st0.id, outs(st0), 0.2) == [StepOutput("b", "x", None)]  # a's dropped
    st1 = s.next_step(0.2, "r0")
    assert (st1.leave, st1.active, [j.id for j in st1.join]) == (("a",), ("b", "d"), ["d"])
    assert s.cancel("b", 0.3) and s.cancel("d", 0.3)
    s.complete(st1.id, outs(st1), 0.3)
    st2 = s.next_step(0.3, "r0")  # a leave-only step frees the idle replica's memory
    assert (st2.leave, st2.active, st2.tokens) == (("b", "d"), (), 0)
    s.complete(st2.id, [], 0.4)
    assert s.next_step(0.4, "r0") is None
    assert s.stats.cancelled == 4 and s.stats.steps == 2  # a leave-only step is no step


def test_lockstep_admits_only_into_an_empty_replica():
    s = sched(max_active=2, schedule="lockstep")
    for rid in "abc":
        s.submit(req(rid), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.complete(st0.id, outs(st0, done={"a"}), 0.1)
    st1 = s.next_step(0.1, "r0")
    assert (st1.active, st1.join) == (("b",), ())  # a slot is free, but c waits
    s.complete(st1.id, outs(st1, done={"b"}), 0.2)
    assert s.next_step(0.2, "r0").active == ("c",)


def test_joins_go_to_the_idle_replica_with_the_fewest_active():
    s = sched("r0", "r1", max_active=4)
    for rid in "ab":
        s.submit(req(rid), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.complete(st0.id, outs(st0), 0.1)
    s.submit(req("c"), 0.1)
    assert s.dispatch_order(["r0", "r1"]) == ["r1", "r0"]
    assert s.next_step(0.1, "r1").active == ("c",)
    assert (s.active_on("r0"), s.active_on("r1")) == (2, 1)


def test_a_failed_step_ends_its_sequences_and_tells_the_replica_to_free_them():
    s = sched(max_active=4)
    for rid in "ab":
        s.submit(req(rid), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.cancel("b", 0.05)
    s.submit(req("c"), 0.05)
    assert s.fail_step(st0.id, 0.1) == ["a"]  # b had already ended (cancelled)
    st1 = s.next_step(0.1, "r0")
    assert (st1.leave, st1.active) == (("b", "a"), ("c",))


def test_outputs_that_do_not_match_the_step_raise_and_change_nothing():
    s = sched()
    s.submit(req("a"), 0.0)
    s.submit(req("b"), 0.0)
    step = s.next_step(0.0, "r0")
    for bad in ([StepOutput("a", "x", None)],
                [StepOutput("a", "x", None), StepOutput("a", "x", None)],
                [StepOutput("a", "x", None), StepOutput("z", "x", None)]):
        with pytest.raises(BatchSizeMismatch, match="one output per active sequence"):
            s.complete(step.id, bad, 0.1)
    assert len(s.complete(step.id, outs(step), 0.1)) == 2


def test_a_removed_replicas_unstarted_sequences_are_requeued_once_and_others_end():
    s = sched("r0", "r1", max_active=4)
    s.submit(req("old"), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.complete(st0.id, outs(st0), 0.1)  # old streamed "x": it cannot be restarted
    s.submit(req("new", timeout_s=1.0), 0.1)
    s.submit(req("held"), 0.1)
    st1 = s.next_step(0.1, "r0")
    s.complete(st1.id, outs(st1, text=""), 0.2)  # held back: nothing streamed yet
    s.next_step(0.2, "r0")  # in flight when r0 goes
    s.submit(req("waiting"), 0.2)
    assert s.remove_replica("r0") == ["old"]
    assert (s.waiting, s.stats.requeued) == (3, 2)
    st2 = s.next_step(5.0, "r1")  # past new's join deadline, but it joined once: no expiry
    assert st2.active == ("new", "held", "waiting") and s.take_failures() == []
    assert s.remove_replica("r1") == ["new", "held"]  # retried once already: they end
    assert (s.waiting, s.stats.requeued, s.stats.failed) == (1, 3, 3)  # "waiting" goes back


def test_a_requeued_sequence_goes_first_and_keeps_no_deadline():
    s = sched("r0", "r1", max_active=1)
    s.submit(req("a", timeout_s=1.0), 0.0)
    st0 = s.next_step(0.0, "r0")  # a's deadline entry stays behind, stale
    s.submit(req("b", timeout_s=9.0), 0.5)  # a deadline sorts before no deadline...
    assert s.remove_replica("r0") == []
    assert s.next_step(2.0, "r1").active == ("a",)  # ...but the requeued one goes first
    assert s.take_failures() == [] and st0.active == ("a",)


def test_submit_refuses_bad_requests_full_queues_and_a_draining_scheduler():
    s = sched(max_queue_size=2, max_tokens_limit=8, max_tokens_default=4)
    s.submit(req("a"), 0.0)
    with pytest.raises(InvalidRequest, match="still open"):
        s.submit(req("a"), 0.0)
    with pytest.raises(InvalidRequest, match="max_tokens=9"):
        s.submit(req("x", max_tokens=9), 0.0)
    with pytest.raises(InvalidRequest, match="empty prompt"):
        s.submit(req("x", ""), 0.0)
    s.submit(req("b"), 0.0)
    with pytest.raises(QueueFull, match="max_queue_size=2"):
        s.submit(req("c"), 0.0)
    assert s.waiting == 2
    s.drain()
    s.cancel("a", 0.0)
    with pytest.raises(ServiceClosed):
        s.submit(req("c"), 0.0)
    assert s.next_step(0.0, "r0").active == ("b",)  # what is queued still runs


def test_statistics_of_steps():
    s = sched(max_active=4)
    s.submit(req("a", "aaa"), 0.0)
    st0 = s.next_step(0.0, "r0")
    s.complete(st0.id, outs(st0), 0.1)
    s.submit(req("b", "b"), 0.1)
    st1 = s.next_step(0.1, "r0")
    s.complete(st1.id, outs(st1, done={"a", "b"}, reason="stop"), 0.2)
    d = s.stats.as_dict()
    assert (d["steps"], d["step_tokens"], d["joins"], d["max_active_seen"]) == (2, 3 + 2, 2, 2)
    assert (d["mean_active_per_step"], d["mean_tokens_per_step"]) == (1.5, 2.5)
    assert d["finished"] == {"stop": 2}


# -- property: random schedules, with a real Generator per replica ---------------------
class Echo(StepModel):
    """Next token = f(previous token); token 0 is eos. Text is letters."""

    eos_id = 0
    max_context = 40

    def encode(self, text):
        return [ord(c) - 96 for c in text]

    def decode(self, tokens):
        return "".join(chr(t + 96) for t in tokens)

    def prefill(self, prompts):
        return [p[-1] for p in prompts]

    def step(self, states):
        nxt = [(s * 7 + 3) % 27 for s in states]
        return nxt, nxt


SUBMIT = st.tuples(st.just("submit"), st.integers(1, 12), st.integers(1, 9),
                   st.integers(0, 2), st.sampled_from([None, 0.5, 3.0]),
                   st.sampled_from([(), ("ek",), ("s", "qn"), ("lfr",), ("zz",)]))
ON_REPLICA = st.tuples(st.sampled_from(["step", "finish"]), st.integers(0, 1))
OPS = st.one_of(  # a branch is drawn uniformly: repeats weigh the common operations
    SUBMIT, SUBMIT, ON_REPLICA, ON_REPLICA, ON_REPLICA, ON_REPLICA,
    st.tuples(st.sampled_from(["cancel", "cancel_running"]), st.integers(0, 12)),
    st.tuples(st.sampled_from(["fail", "kill"]), st.integers(0, 1)),
    st.tuples(st.just("tick")),
)


class World:
    """The scheduler, a Generator per replica, and what every request got."""

    def __init__(self, policy: IterativePolicy) -> None:
        self.s, self.policy, self.now = IterativeScheduler(policy), policy, 0.0
        self.gens, self.inflight, self.keys = {}, {}, [0, 1]
        for k in self.keys:
            self.add(k)
        self.ends, self.cancelled_at, self.tokens, self.ids = {}, {}, {}, []

    def add(self, k):
        self.s.add_replica(k)
        self.gens[k] = Generator(Echo())

    def end(self, rid, how):
        assert rid not in self.ends, f"{rid} ended twice: {self.ends[rid]} and {how}"
        self.ends[rid] = how

    def do(self, op):
        getattr(self, "op_" + op[0])(*op[1:])
        for f in self.s.take_failures():
            self.end(f.request_id, "expired")

    def op_submit(self, prompt_len, max_tokens, prio, timeout_s, stop):
        rid = len(self.ids)
        prompt = "abcdefghijklmnopqrstuvwxyz"[:prompt_len]
        try:
            self.s.submit(GenerateRequest(rid, prompt, max_tokens, stop, prio, timeout_s),
                          self.now)
        except QueueFull:
            return
        self.ids.append(rid)
        self.tokens[rid] = 0

    def op_cancel(self, i):
        if i < len(self.ids) and self.s.cancel(self.ids[i], self.now):
            self.end(self.ids[i], "cancelled")
            self.cancelled_at[self.ids[i]] = True

    def op_cancel_running(self, i):
        """Cancel a sequence of a step in flight (its output must be dropped)."""
        running = sorted({rid for step in self.inflight.values() for rid in step.active
                          if rid not in self.ends})
        if running:
            self.op_cancel(self.ids.index(running[i % len(running)]))

    def op_step(self, k):
        if k in self.inflight:
            return
        step = self.s.next_step(self.now, k)
        if step is None:
            return
        p = self.policy
        assert len(step.active) <= p.max_active and step.tokens <= p.max_step_tokens
        if p.schedule == "lockstep" and step.join:
            assert len(step.join) == len(step.active)
        self.inflight[k] = step

    def op_finish(self, k):
        step = self.inflight.pop(k, None)
        if step is None:
            return
        outputs = self.gens[k].step(step.join, step.leave)  # mismatches would raise below
        for out in self.s.complete(step.id, outputs, self.now):
            assert out.id not in self.cancelled_at, f"{out.id} got output after its cancel"
            self.tokens[out.id] += out.tokens
            assert self.tokens[out.id] <= 9
            if out.finished:
                self.end(out.id, out.finished)

    def op_fail(self, k):
        step = self.inflight.pop(k, None)
        if step is not None:
            self.gens[k] = Generator(Echo())  # what a failed step leaves: nothing live
            for rid in self.s.fail_step(step.id, self.now):
                self.end(rid, "failed")

    def op_kill(self, k):
        self.inflight.pop(k, None)
        for rid in self.s.remove_replica(k):
            self.end(rid, "died")
        self.add(k)

    def op_tick(self):
        self.now += 1.0

    def settle(self):
        for _ in range(500):
            if not (self.s.waiting or self.s.active or self.inflight):
                return
            for k in self.keys:
                self.op_finish(k)
                self.op_step(k)
            self.now += 0.1
            self.do(("tick",))
        raise AssertionError("the schedule did not settle")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=5, max_size=80), max_active=st.integers(1, 3),
       budget=st.integers(0, 10), schedule=st.sampled_from(["continuous", "lockstep"]))
def test_random_schedules_keep_every_invariant(ops, max_active, budget, schedule):
    policy = IterativePolicy(max_active=max_active, max_step_tokens=12 + budget,
                             priority_levels=2, max_queue_size=12, schedule=schedule)
    w = World(policy)
    for op in ops:
        w.do(op)
    w.settle()
    assert sorted(w.ends) == w.ids  # every request ended, exactly once (end() checks)
    assert all(g.live == 0 or k in w.keys for k, g in w.gens.items())
    assert w.s.waiting == 0 and w.s.active == 0
