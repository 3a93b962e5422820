"""Hypothesis properties of DynamicBatcher + Ledger driven together by a fake host.

A random scenario (policy, arrivals, cancels, ticks with a random number of free
replicas, completions in random order, some with a failed item or a wrong result
count) runs against an independent model of what is queued. The fake model's
result for item v is 2v + 1, and item values are unique to their request, so a
result that reached the wrong request, or the right one out of order, shows.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.batching.dynamic.property_host import TIMES, Host, ops, policies, submits


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=policies(),
    script=st.lists(ops, min_size=5, max_size=50),
    arrays=st.booleans(),
    finish_order=st.lists(st.integers(0, 50), max_size=10),
)
def test_engine_and_ledger_keep_their_promises(scenario, script, arrays, finish_order):
    policy, mode = scenario
    host = Host(policy, mode, arrays)
    for op, dt, *args in script:
        host.now += dt
        getattr(host, op)(*args)
    host.finish(finish_order)
    host.check_outcomes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenario=policies(),
    burst=st.lists(submits(), min_size=2, max_size=12),
    ticks=st.lists(st.tuples(st.just("tick"), st.sampled_from(TIMES), st.just(1)), max_size=12),
    arrays=st.booleans(),
)
def test_a_burst_leaves_in_level_then_deadline_order(scenario, burst, ticks, arrays):
    """Requests queued together, then taken one batch at a time: the order checks bite."""
    policy, mode = scenario
    host = Host(policy, mode, arrays)
    for op, dt, *args in [*burst, *ticks]:
        host.now += dt
        getattr(host, op)(*args)
    host.finish([])
    host.check_outcomes()
