"""Sweeping candidates with the simulator and picking one for a latency target."""

from __future__ import annotations

import pytest

from batching.dynamic.policy import DynamicPolicy
from batching.simulate import Candidate, ClosedLoop, Poisson, cheapest, curve, sweep

A, B = 0.002, 0.00005  # a batch takes 2 ms + 0.05 ms per item; 64 items: 5.2 ms
MODEL = {"latency_a_s": A, "latency_b_s": B, "duration_s": 1.0, "warmup_s": 0.2}


def cand(name: str, replicas: int = 1, timeout_s: float | None = None, **policy) -> Candidate:
    return Candidate(name, DynamicPolicy(**{"max_batch_size": 64, **policy}), replicas,
                     timeout_s)


def test_sweep_gives_one_point_per_candidate_and_load_in_order():
    pts = sweep([cand("a"), cand("b", max_queue_delay_s=0.001)], [1, 4], ClosedLoop, **MODEL)
    assert [(p.name, p.load) for p in pts] == [("a", 1), ("a", 4), ("b", 1), ("b", 4)]
    assert [p.load for p in curve(pts, "b")] == [1, 4]


def test_a_closed_loop_of_one_waits_out_the_delay_on_every_request():
    pts = sweep([cand("greedy"), cand("wait", max_queue_delay_s=0.003)], [1], ClosedLoop,
                **MODEL)
    greedy, wait = (curve(pts, n)[0] for n in ("greedy", "wait"))
    assert greedy.p50_ms == pytest.approx(2.05)  # the model alone
    assert wait.p50_ms == pytest.approx(5.05)  # plus the whole delay


def test_the_candidate_decides_replicas():
    # 20k requests/s is past one replica's ceiling (64 items per 5.2 ms: ~12.3k/s)
    pts = sweep([cand("one"), cand("two", replicas=2)], [20_000], Poisson, **MODEL)
    one, two = pts
    assert one.report.throughput_rps < 13_000
    assert two.report.throughput_rps == pytest.approx(20_000, rel=0.05)


def test_a_deadline_sheds_an_overload_instead_of_queueing_it():
    pts = sweep([cand("queue"), cand("deadline", timeout_s=0.010)], [20_000], Poisson, **MODEL)
    queue, deadline = pts
    assert queue.failed_share == 0 and queue.p99_ms > 100
    assert deadline.failed_share > 0.2
    assert deadline.p99_ms < 25  # what ran, ran in time: queued <= 10 ms, then compute


def test_cheapest_takes_the_fewest_replicas_that_meet_the_target():
    cands = [cand("1 replica"), cand("2 replicas", replicas=2),
             cand("3 replicas", replicas=3)]
    pts = sweep(cands, [8_000, 20_000], Poisson, **MODEL)
    assert cheapest(pts, p99_ms=20, load=8_000).name == "1 replica"
    assert cheapest(pts, p99_ms=20, load=20_000).name == "2 replicas"
    assert cheapest(pts, p99_ms=1, load=8_000) is None  # below the model's own 2 ms


def test_a_point_with_failures_never_meets_a_target():
    pts = sweep([cand("deadline", timeout_s=0.010)], [20_000], Poisson, **MODEL)
    assert pts[0].p99_ms < 25 and not pts[0].meets(p99_ms=1_000)
    assert cheapest(pts, p99_ms=1_000, load=20_000) is None


def test_sweep_refuses_settings_that_belong_to_a_candidate():
    with pytest.raises(ValueError, match="replicas belong to each Candidate"):
        sweep([cand("a")], [1], ClosedLoop, replicas=2, **MODEL)


def test_curve_names_the_candidates_when_one_is_missing():
    pts = sweep([cand("a")], [1], ClosedLoop, **MODEL)
    with pytest.raises(KeyError, match=r"there are \['a'\]"):
        curve(pts, "b")
