"""`raybatch status --watch`: the view of two looks at the statistics, and the frames."""

from __future__ import annotations

import pytest

from batching.stats import LATENCY_BUCKETS_S
from raybatch.watch import duration, frames, model_view, render


def hist(**buckets: int) -> list[int]:
    """Bucket counts: hist(b3=4) puts 4 values in (0.5 ms, 1 ms]."""
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for key, n in buckets.items():
        counts[int(key[1:])] = n
    return counts


def dynamic(ok, failed, items, batches, waits, **kw):
    return {"kind": "dynamic", "success": {"count": ok, "s": 0.0},
            "fail": {"count": failed, "s": 0.0}, "items": items, "batches": batches,
            "queue_hist": waits, "queued_requests": 3, "queued_items": 7, "batch_limit": 64,
            "replica_info": [{"state": "ALIVE"}, {"state": "ALIVE"}, {"state": "PENDING"}],
            **kw}


def test_rates_fill_and_waits_cover_only_what_happened_between_two_looks():
    before = dynamic(100, 1, 1000, 100, hist(b3=100))
    after = dynamic(300, 5, 3000, 150, hist(b3=100, b6=100))
    v = model_view("square", after, before, 2.0)
    assert (v.req_s, v.err_s) == (pytest.approx(102.0), pytest.approx(2.0))
    assert v.fill == pytest.approx(2000 / 50 / 64)
    assert 0.005 < v.wait_p50_s <= 0.01 and v.wait_p99_s <= 0.01  # the old ones left out
    assert (v.running, v.pending, v.queued) == (2, 1, "3 (7)")


def test_the_first_look_has_no_rates_and_shows_the_lifetime():
    v = model_view("square", dynamic(10, 0, 40, 10, hist(b3=10)), None, None)
    assert v.req_s is None and v.err_s is None
    assert v.fill == pytest.approx(4 / 64) and 0.0005 < v.wait_p50_s <= 0.001


def test_a_generative_model_counts_generations_and_sequences_per_step():
    s0 = {"kind": "iterative", "completed": 4, "failed": 0, "steps": 10,
          "mean_active_per_step": 2.0, "waiting": 0, "batch_limit": 16, "replica_info": []}
    s1 = {**s0, "completed": 14, "failed": 2, "steps": 30, "mean_active_per_step": 3.0,
          "waiting": 5}
    v = model_view("tinylm", s1, s0, 4.0)
    assert (v.req_s, v.err_s, v.queued) == (3.0, 0.5, "5")
    assert v.fill == pytest.approx((90 - 20) / 20 / 16)
    assert v.wait_p50_s is None  # no queue waits reported: shown as "-"


def test_cancelled_requests_count_as_ended_not_as_errors():
    s0 = dynamic(10, 2, 12, 3, hist())
    s1 = {**dynamic(30, 12, 42, 8, hist()), "cancelled": 8}
    v = model_view("square", s1, s0, 2.0)
    assert (v.req_s, v.err_s) == (15.0, 1.0)  # 30 ended, 2 of them errors


def test_cancelled_generations_count_as_ended_not_as_errors():
    s0 = {"kind": "iterative", "completed": 4, "failed": 0, "cancelled": 0, "steps": 10,
          "mean_active_per_step": 2.0, "waiting": 0, "batch_limit": 16, "replica_info": []}
    s1 = {**s0, "completed": 6, "cancelled": 6, "steps": 20}
    v = model_view("tinylm", s1, s0, 2.0)
    assert (v.req_s, v.err_s) == (4.0, 0.0)


def test_durations_read_in_the_unit_that_fits():
    assert [duration(x) for x in (None, 0.00042, 0.0123, 2.5)] == ["-", "420 us", "12.3 ms",
                                                                   "2.50 s"]


def test_frames_refresh_until_the_count_and_render_one_row_per_model():
    looks = iter([{"square": dynamic(0, 0, 0, 0, hist())},
                  {"square": dynamic(50, 0, 500, 10, hist(b4=50))}])
    times = iter([0.0, 1.0])
    slept = []
    out = list(frames("raybatch", lambda: next(looks), 1.0, count=2, clock=lambda: next(times),
                      sleep=slept.append, wall=lambda fmt: "12:00:00"))
    assert len(out) == 2 and slept == [1.0]
    lines = out[1].splitlines()
    assert lines[0].startswith("raybatch   every 1 s   12:00:00")
    assert lines[2].split()[:3] == ["MODEL", "KIND", "REQ/S"]
    cells = lines[3].split()
    assert cells[:4] == ["square", "dynamic", "50.0", "0.0"]
    assert "78% of 64" in lines[3] and "2 +1 pending" in lines[3]


def test_render_lines_up_columns():
    a = model_view("a", dynamic(1, 0, 1, 1, hist()), None, None)
    b = model_view("a-much-longer-name", dynamic(1, 0, 1, 1, hist()), None, None)
    lines = render("app", [a, b], 2.0, "t").splitlines()[2:]
    assert len({line.index("dynamic") for line in lines[1:]}) == 1
