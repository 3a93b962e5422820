"""The ingress answers every request by its deadline, whatever its batching actor does
(`deployments.ingress.coalesce`): a bundle that never comes back (the actor or its replica cut
off) fails each request at its own deadline plus `LATE_ANSWER_S` with 504 and cancels it
at the actor; a late answer reaches nobody; which requests have a deadline follows the
engine's own rule (`route.hard_timeout`), on the time left until each request's deadline
(an instant of the clock, set by the route). A fake actor, a fake clock; the sweep timer
is stood in for by calling it."""

from __future__ import annotations

from batching.dynamic.policy import DynamicPolicy, QueuePolicy, TimeoutAction
from batching.errors import NoAnswerInTime, http_status
from batching.sequence.policy import SequencePolicy
from deployments.ingress.coalesce import LATE_ANSWER_S, Coalescer
from deployments.ingress.route import hard_timeout
from tests.conftest import arun as run
from tests.unit.deployments.test_coalesce import FakeActor, spin


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_bundle_that_never_comes_back_fails_each_request_at_its_own_deadline():
    async def main():
        actor, clock = FakeActor(), Clock()
        c = Coalescer(lambda: actor, bundle_items=8, clock=clock)
        short, long_, none = (c.submit([1], None, clock.now + 1.0),
                              c.submit([2], None, clock.now + 3.0), c.submit([3], None, None))
        await spin()
        assert len(actor.bundles) == 1
        clock.now += 1.0 + LATE_ANSWER_S - 0.01
        c._end_overdue()
        assert not short.done()
        clock.now += 0.01
        c._end_overdue()
        await spin()
        error = short.exception()
        assert isinstance(error, NoAnswerInTime) and http_status(error) == 504
        assert "deadline" in str(error) and not long_.done()
        assert [args[1] for args, _ in actor.cancels] == [[0]]  # cancelled at the actor
        clock.now += 2.0
        c._end_overdue()
        await spin()
        assert isinstance(long_.exception(), NoAnswerInTime) and not none.done()
        assert c.outstanding == 1 and c.late == 2
        actor.answer(0)  # the actor's answer, late: only the request still open gets it
        await spin()
        assert none.result() == [30] and isinstance(short.exception(), NoAnswerInTime)
        assert c.outstanding == 0
    run(main())


def test_requests_answered_in_time_are_not_touched_and_leave_little_behind():
    async def main():
        actor, clock = FakeActor(), Clock()
        c = Coalescer(lambda: actor, bundle_items=64, clock=clock)
        for _ in range(40):
            futs = [c.submit([x], None, clock.now + 5.0) for x in range(64)]
            await spin()
            actor.answer(len(actor.bundles) - 1)
            await spin()
            assert [f.result() for f in futs] == [[10 * x] for x in range(64)]
        clock.now += 10.0
        c._end_overdue()
        return c

    c = run(main())
    assert c.late == 0 and c._answer_by == [] and c._sweep is None


def test_a_cancelled_request_is_cancelled_once_even_at_its_deadline():
    async def main():
        actor, clock = FakeActor(), Clock()
        c = Coalescer(lambda: actor, bundle_items=8, clock=clock)
        fut = c.submit([1], None, clock.now + 1.0)
        await spin()
        fut.cancel()
        clock.now += 2.0
        c._end_overdue()  # before the cancel's callback has run
        await spin()
        return actor.cancels, c.late

    cancels, late = run(main())
    assert [args[1] for args, _ in cancels] == [[0]] and late == 0


def test_which_requests_have_a_deadline_follows_the_engines_rule():
    hard = hard_timeout(DynamicPolicy(
        max_batch_size=4, priority_levels=3,
        priority_queue_policy={
            1: QueuePolicy(default_timeout_s=2.0, allow_timeout_override=False),
            2: QueuePolicy(default_timeout_s=9.0, timeout_action=TimeoutAction.DELAY)}))
    assert hard(None, 4.0) == 4.0 and hard(3, None) is None  # level 3: the request's own
    assert hard(1, 0.5) == 2.0 and hard(1, None) == 2.0  # no override: the level's
    assert hard(2, 1.0) is None  # delay: a late request still runs
    assert hard(7, 1.0) == 1.0  # out of range: refused by the engine anyway
    assert hard_timeout(DynamicPolicy(
        max_batch_size=4, default_queue_policy=QueuePolicy(default_timeout_s=3.0)))(
        None, 5.0) == 3.0  # the sooner of the two
    assert hard_timeout(SequencePolicy(max_batch_size=2))(None, 1.5) == 1.5
