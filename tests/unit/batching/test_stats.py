"""Queue waits as bucket counts, and their quantiles as Prometheus computes them."""

from __future__ import annotations

import pytest

from batching.stats import LATENCY_BUCKETS_S, BatchStats, WaitHistogram, quantile


def test_a_value_on_a_bound_counts_in_that_bound_s_bucket_as_prometheus_le_does():
    h = WaitHistogram()
    for v in (0.0, 0.0001, 0.00010001, 0.001, 31.0):
        h.observe(v)
    assert h.counts[0] == 2 and h.counts[1] == 1 and h.counts[3] == 1 and h.counts[-1] == 1
    assert len(h.counts) == len(LATENCY_BUCKETS_S) + 1


def test_quantiles_interpolate_inside_the_bucket_and_cap_at_the_highest_bound():
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    counts[3], counts[6] = 8, 2  # 8 in (0.5, 1] ms, 2 in (5, 10] ms
    assert quantile(0.5, counts) == pytest.approx(0.0005 + 0.0005 * 5 / 8)
    assert quantile(0.9, counts) == pytest.approx(0.005 + 0.005 * 1 / 2)
    assert quantile(1.0, counts) == pytest.approx(0.01)
    counts[-1] = 100
    assert quantile(0.99, counts) == LATENCY_BUCKETS_S[-1]
    assert quantile(0.5, [0] * len(counts)) is None


def test_batch_stats_keep_the_queue_waits_bucketed_for_the_status_view():
    s = BatchStats()
    for w in (0.0002, 0.0002, 0.004):
        s.record_queue(w)
    hist = s.as_dict()["queue_hist"]
    assert sum(hist) == 3 == s.queue_count
    assert quantile(0.5, hist) <= 0.00025 < 0.0025 < quantile(0.99, hist) <= 0.005
