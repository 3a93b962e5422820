"""What a sweep point keeps: the batcher's counts of its own window, and the best of repeats."""

from __future__ import annotations

import math

import pytest

from benchmarks.engine.sweep import RealPoint, best_run, by_name, window_counts


def point(name="a", load=1, p99_ms=1.0, sizes=None) -> RealPoint:
    return RealPoint(name, "closed", load, 100.0, 1.0, p99_ms, 10, 0, sizes or {1: 10}, {})


def test_window_counts_are_the_difference_of_two_readings():
    before = {"by_size": {1: 3, 8: 2}, "by_reason": {"delay": 5}}
    after = {"by_size": {1: 3, 8: 6, 32: 1}, "by_reason": {"delay": 9, "full": 1}}
    assert window_counts(before, after, "by_size") == {8: 4, 32: 1}  # size 1 did not change
    assert window_counts(before, after, "by_reason") == {"delay": 4, "full": 1}


def test_window_counts_refuse_readings_of_another_service():
    with pytest.raises(ValueError, match="went down"):
        window_counts({"by_size": {1: 5}}, {"by_size": {1: 2}}, "by_size")
    with pytest.raises(ValueError, match="went down"):
        window_counts({"by_size": {4: 1}}, {"by_size": {1: 2}}, "by_size")


def test_mean_batch_size_weighs_sizes_by_batches():
    p = point(sizes={1: 2, 4: 2})
    assert (p.batches, p.mean_batch_size) == (4, 2.5)


def test_best_run_is_the_least_disturbed_one():
    runs = [point(p99_ms=9.0), point(p99_ms=math.nan), point(p99_ms=3.0)]
    assert best_run(runs).p99_ms == 3.0
    assert math.isnan(best_run([point(p99_ms=math.nan)]).p99_ms)


def test_by_name_sorts_by_load_and_names_the_choices():
    pts = [point("a", 16), point("b", 1), point("a", 1)]
    assert [p.load for p in by_name(pts, "a")] == [1, 16]
    with pytest.raises(KeyError, match=r"\['a', 'b'\]"):
        by_name(pts, "c")
