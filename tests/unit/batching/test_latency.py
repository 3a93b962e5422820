"""LatencyModel: an online, exponentially weighted fit of latency = a + b * cost."""

from __future__ import annotations

import pytest

from batching import LatencyModel


def test_cold_until_min_samples():
    m = LatencyModel(min_samples=3)
    assert not m.warm and m.coefficients == (0.0, 0.0) and m.predict(10) == 0.0
    m.observe(1, 0.002)
    m.observe(2, 0.003)
    assert not m.warm
    m.observe(4, 0.005)
    assert m.warm


def test_recovers_an_exact_line():
    m = LatencyModel()
    for cost in (1, 3, 8, 20, 2, 50):
        m.observe(cost, 0.004 + 0.0005 * cost)
    assert m.coefficients == pytest.approx((0.004, 0.0005))
    assert m.predict(100) == pytest.approx(0.054)


def test_one_cost_only_gives_a_flat_mean():
    m = LatencyModel(decay=1.0)
    for lat in (0.010, 0.020, 0.030):
        m.observe(16, lat)
    assert m.coefficients == pytest.approx((0.020, 0.0))
    assert m.predict(1000) == pytest.approx(0.020)


def test_large_equal_costs_do_not_make_up_a_slope():
    m = LatencyModel()
    for lat in (0.010, 0.011, 0.009, 0.010):
        m.observe(1e6, lat)
    a, b = m.coefficients
    assert b == 0.0 and a == pytest.approx(0.010, rel=0.05)


def test_slope_never_negative_and_predictions_never_negative():
    m = LatencyModel()
    m.observe(1, 0.010)
    m.observe(10, 0.001)  # bigger batch "faster": noise, not physics
    a, b = m.coefficients
    assert b == 0.0 and a > 0
    m2 = LatencyModel()
    m2.observe(10, 0.001)
    m2.observe(20, 0.050)  # steep: the intercept would be negative
    assert m2.coefficients[0] == 0.0
    assert m2.predict(0) == 0.0 and m2.predict(15) > 0


def test_decay_follows_a_replica_that_slows_down():
    m = LatencyModel(decay=0.8)
    for _ in range(20):
        m.observe(8, 0.010)
    for _ in range(20):
        m.observe(8, 0.030)
    assert m.predict(8) == pytest.approx(0.030, rel=0.02)
    no_decay = LatencyModel(decay=1.0)
    for lat in [0.010] * 20 + [0.030] * 20:
        no_decay.observe(8, lat)
    assert no_decay.predict(8) == pytest.approx(0.020)
