"""Adaptive delay and the deadline flush, both driven by the learned latency model.

The latency model is trained through `complete(batch_id, now, compute_s=...)` on a
second batcher sharing the same `LatencyModel` (see `warm_latency` in conftest), to
latency = 4 ms + 1 ms per item, so the batcher under test sees no extra arrivals.
"""

from __future__ import annotations

import pytest

from batching import DynamicBatcher, DynamicPolicy, FlushReason, LatencyModel, QueuePolicy

A_S, B_S = 0.004, 0.001


def predict(cost: float) -> float:
    return A_S + B_S * cost


def adaptive(target_latency_s=0.050, **kw) -> DynamicBatcher:
    kw.setdefault("max_batch_size", 256)
    kw.setdefault("max_queue_delay_s", 0.010)
    return DynamicBatcher(DynamicPolicy(adaptive_delay=True, target_latency_s=target_latency_s,
                                        **kw))


def steady_arrivals(q, req, gap_s: float, until_s: float):
    """Submit one request every `gap_s` from t=0, asking for a batch after each.

    The first request goes at once (no arrival rate is known yet); returns when and
    what the second batch, the first one formed under a known rate, was sent.
    """
    q.submit(req(0), now=0.0)
    first = q.next_batch(now=0.0, free_replicas=1)
    assert first.ids == [0]
    t, i = gap_s, 1
    while t <= until_s:
        q.submit(req(i), now=t)
        batch = q.next_batch(now=t, free_replicas=1)
        if batch is not None:
            return t, batch
        i += 1
        t = round(t + gap_s, 9)
    return None, None


def test_the_warm_up_helper_trains_the_model_it_claims(warm):
    q = adaptive()
    assert not q.latency.warm
    warm(q, A_S, B_S)
    assert q.latency.coefficients == pytest.approx((A_S, B_S))


def test_cold_model_falls_back_to_max_queue_delay(req):
    q = adaptive(max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.0)
    assert q.deadline() == pytest.approx(0.010)
    assert q.next_batch(now=0.009, free_replicas=1) is None
    assert q.next_batch(now=0.010, free_replicas=1).reason is FlushReason.DELAY


def test_warm_model_at_low_arrival_rate_sends_at_once(req, warm):
    q = adaptive(max_queue_delay_s=0.010)
    warm(q, A_S, B_S)
    q.submit(req("a"), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["a"]  # no fixed 10 ms wait
    q.submit(req("b"), now=1.0)  # one request a second: waiting buys nothing
    assert q.next_batch(now=1.0, free_replicas=1).ids == ["b"]


def test_warm_model_at_high_rate_waits_but_meets_the_oldest_target(req, warm):
    q = adaptive(target_latency_s=0.050, max_queue_delay_s=0.010)
    warm(q, A_S, B_S)
    sent_s, batch = steady_arrivals(q, req, gap_s=0.001, until_s=0.050)
    assert batch is not None and batch.reason is FlushReason.DELAY
    assert sent_s > 0.001 + 0.010  # waited longer than the fixed delay: the target allows it
    assert batch.ids[0] == 1 and batch.num_items == round(sent_s / 0.001)
    assert sent_s + predict(batch.cost) <= 0.001 + 0.050 + 1e-9  # request 1 arrived at 0.001
    # and it did not give up early: one more arrival would have missed the target
    assert sent_s + 0.001 + predict(batch.cost + 1) > 0.001 + 0.050


def test_a_looser_target_waits_longer(req, warm):
    sent = {}
    for target in (0.030, 0.060):
        q = adaptive(target_latency_s=target)
        warm(q, A_S, B_S)
        sent[target], _ = steady_arrivals(q, req, gap_s=0.001, until_s=0.1)
    assert sent[0.030] < sent[0.060]


def test_a_slower_model_sends_sooner(req, warm):
    sent = {}
    for b_s in (0.0005, 0.002):
        q = adaptive(target_latency_s=0.050)
        warm(q, A_S, b_s)
        sent[b_s], _ = steady_arrivals(q, req, gap_s=0.001, until_s=0.1)
    assert sent[0.002] < sent[0.0005]


def test_adaptive_deadline_is_the_adaptive_send_time(req, warm):
    q = adaptive(target_latency_s=0.050)
    warm(q, A_S, B_S)
    q.submit(req(0), now=0.0)
    q.submit(req(1), now=0.001)  # inter-arrival estimate: 1 ms
    expected = 0.0 + 0.050 - (predict(2 + q._request_cost) + 0.001)
    assert q.deadline() == pytest.approx(expected)


def test_adaptive_deadline_is_never_minus_infinity(req, warm):
    # one arrival: no rate yet, so waiting is worthless and the batch is due at once
    q = adaptive(max_batch_size=2)
    warm(q, A_S, B_S)
    q.submit(req("a", 5), now=3.0)
    assert q.next_batch(now=3.0, free_replicas=1).num_items == 2
    assert q.deadline() == 3.0  # due now; a time the host can sleep until, not -inf


# -- the deadline flush --------------------------------------------------------------------
def fixed(**kw) -> DynamicBatcher:
    kw.setdefault("max_queue_delay_s", 1.0)
    return DynamicBatcher(DynamicPolicy(max_batch_size=64, **kw))


def test_warm_model_flushes_when_a_deadline_leaves_no_time_to_wait(req, warm):
    q = fixed()
    warm(q, A_S, B_S)
    q.submit(req("a", timeout_s=0.050), now=0.0)
    q.submit(req("b"), now=0.010)
    assert q.deadline() == pytest.approx(0.050 - predict(2))
    assert q.next_batch(now=0.0439, free_replicas=1) is None
    b = q.next_batch(now=0.0441, free_replicas=1)
    assert (b.ids, b.reason) == (["a", "b"], FlushReason.DEADLINE)


def test_deadline_flush_accounts_for_the_batch_size(req, warm):
    q = fixed()
    warm(q, A_S, B_S)
    q.submit(req("a", 20, timeout_s=0.050), now=0.0)
    assert q.deadline() == pytest.approx(0.050 - predict(20))
    assert q.next_batch(now=0.0259, free_replicas=1) is None
    assert q.next_batch(now=0.0261, free_replicas=1).reason is FlushReason.DEADLINE


def test_deadline_flush_watches_the_earliest_deadline_of_any_level(req, warm):
    q = fixed(priority_levels=2, priority_queue_policy={2: QueuePolicy(default_timeout_s=0.05)})
    warm(q, A_S, B_S)
    q.submit(req("hi", priority=1), now=0.0)
    q.submit(req("lo", priority=2), now=0.0)
    assert q.deadline() == pytest.approx(0.050 - predict(2))


def test_cold_model_waits_the_delay_when_the_deadline_comes_after_it(req):
    q = fixed(max_queue_delay_s=0.040)
    q.submit(req("a", timeout_s=0.050), now=0.0)
    assert q.deadline() == pytest.approx(0.040)
    assert q.next_batch(now=0.039, free_replicas=1) is None
    assert q.next_batch(now=0.040, free_replicas=1).reason is FlushReason.DELAY


def test_cold_model_sends_at_once_when_the_delay_would_outlast_a_deadline(req):
    # no latency estimate: waiting 1 s for a request that must be done in 50 ms would
    # fail it for sure (and a model that never runs never warms up)
    q = fixed(max_queue_delay_s=1.0)
    q.submit(req("a"), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1) is None
    q.submit(req("b", timeout_s=0.050), now=0.010)
    assert q.deadline() == 0.0  # due now
    b = q.next_batch(now=0.010, free_replicas=1)
    assert (b.ids, b.reason) == (["b", "a"], FlushReason.DEADLINE)  # earliest deadline first


def test_cold_model_with_busy_replicas_lets_the_request_expire(req):
    q = fixed(max_queue_delay_s=1.0)
    q.submit(req("a", timeout_s=0.050), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=0) is None
    assert q.deadline() == pytest.approx(0.050)
    assert q.next_batch(now=0.050, free_replicas=1) is None
    assert [f.request_id for f in q.take_failures()] == ["a"]


def test_no_deadline_flush_while_no_replica_is_free(req, warm):
    q = fixed()
    warm(q, A_S, B_S)
    q.submit(req("a", timeout_s=0.050), now=0.0)
    assert q.next_batch(now=0.046, free_replicas=0) is None
    assert q.deadline() == pytest.approx(0.050)


def test_complete_without_compute_s_measures_from_the_batch_creation(req):
    model = LatencyModel(min_samples=1)
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4), latency=model)
    q.submit(req("a", 3), now=1.0)
    b = q.next_batch(now=1.5, free_replicas=1)
    q.complete(b.id, now=1.75)
    assert model.warm and model.predict(3) == pytest.approx(0.25)
