"""`LocalApp`'s teardown: every step runs, in order, even when one fails (no Ray here)."""

from __future__ import annotations

import math
import socket

import pytest

from deployments.local import MetricsSample, bucket_names, free_port, run_all


def test_every_step_runs_and_the_first_failure_is_raised_after_them():
    ran = []

    def fail(name):
        def step():
            ran.append(name)
            raise OSError(f"{name} broke")
        return step

    with pytest.raises(RuntimeError, match="'delete the app' failed: OSError") as info:
        run_all([("delete the app", fail("delete")), ("shut Serve down", fail("serve")),
                 ("shut Ray down", lambda: ran.append("ray"))])
    assert ran == ["delete", "serve", "ray"]
    assert str(info.value.__cause__) == "delete broke"


def test_a_clean_teardown_raises_nothing():
    ran = []
    run_all([("a", lambda: ran.append("a")), ("b", lambda: ran.append("b"))])
    assert ran == ["a", "b"]


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# What Ray's metrics endpoint serves, cut down: two workers, a counter per flush reason, a
# sampled histogram exported through gauges (cumulative `_bucket{le}`), and Ray's own series.
SCRAPE = """\
# HELP ray_raybatch_batches_total Batches sent, by why they left the queue.
# TYPE ray_raybatch_batches_total counter
ray_raybatch_batches_total{WorkerId="a",model="mlp",reason="delay",version="1"} 7.0
ray_raybatch_batches_total{WorkerId="a",model="mlp",reason="full",version="1"} 0.0
ray_raybatch_batches_total{WorkerId="b",model="mlp",reason="delay",version="1"} 3.0
ray_raybatch_batches_total{WorkerId="b",model="mlp",reason="idle",version="1"} 2.0
ray_raybatch_batches_total{WorkerId="b",model="square",reason="full",version="1"} 5.0
# HELP ray_raybatch_batch_size_items_bucket Items per batch.
# TYPE ray_raybatch_batch_size_items_bucket gauge
ray_raybatch_batch_size_items_bucket{WorkerId="a",le="1.0",model="mlp",version="1"} 2.0
ray_raybatch_batch_size_items_bucket{WorkerId="a",le="2.0",model="mlp",version="1"} 3.0
ray_raybatch_batch_size_items_bucket{WorkerId="a",le="4.0",model="mlp",version="1"} 7.0
ray_raybatch_batch_size_items_bucket{WorkerId="a",le="+Inf",model="mlp",version="1"} 7.0
ray_raybatch_batch_size_items_bucket{WorkerId="b",le="1.0",model="mlp",version="1"} 0.0
ray_raybatch_batch_size_items_bucket{WorkerId="b",le="2.0",model="mlp",version="1"} 0.0
ray_raybatch_batch_size_items_bucket{WorkerId="b",le="4.0",model="mlp",version="1"} 4.0
ray_raybatch_batch_size_items_bucket{WorkerId="b",le="+Inf",model="mlp",version="1"} 5.0
# HELP ray_tasks Ray's own.
# TYPE ray_tasks gauge
ray_tasks{State="RUNNING"} 3.0
"""


def test_a_scrape_keeps_raybatch_series_under_their_declared_names():
    m = MetricsSample.parse(SCRAPE)
    assert {n for n, _, _ in m.samples} == {"raybatch_batches_total",
                                            "raybatch_batch_size_items_bucket"}
    assert m.total("raybatch_batches_total") == 17
    assert m.total("raybatch_batches_total", model="mlp") == 12
    assert m.total("raybatch_batches_total", model="mlp", reason="delay") == 10
    assert m.total("raybatch_batches_total", model="nope") == 0


def test_by_sums_over_workers_per_label_value_and_leaves_zeros_out():
    m = MetricsSample.parse(SCRAPE)
    assert m.by("raybatch_batches_total", "reason", model="mlp") == {"delay": 10, "idle": 2}
    assert m.by("raybatch_batches_total", "model") == {"mlp": 12, "square": 5}


def test_histogram_turns_cumulative_buckets_of_every_worker_into_counts_per_bucket():
    hist = MetricsSample.parse(SCRAPE).histogram("raybatch_batch_size_items", model="mlp")
    assert hist == {1.0: 2, 2.0: 1, 4.0: 8, math.inf: 1}
    assert sum(hist.values()) == 12


def test_bucket_names_say_which_whole_numbers_each_bucket_holds():
    assert bucket_names([1, 2, 4, 8, math.inf]) == ["1", "2", "3-4", "5-8", ">8"]
    assert bucket_names([2.0, 4.0, 16.0]) == ["1-2", "3-4", "5-16"]
