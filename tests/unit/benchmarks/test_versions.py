"""The version comparison's arithmetic and table, on made-up rows (no servers)."""

from __future__ import annotations

import pytest

from benchmarks.peers.versions import parse_args, ratios, render


def _row(shape: str, version: str, kind: str, rps: float, p50: float, rnd: int = 1) -> dict:
    return {"shape": shape, "version": version, "kind": kind, "round": rnd,
            "request": f"OIP {kind}", "c128": {"throughput_rps": rps, "loadavg": [1.0]},
            "c1": {"p50_ms": p50}}


def test_ratios_sum_the_rounds_of_each_version():
    rows = [_row("raybatch", "this", "binary", 100, 1.0, 1),
            _row("raybatch", "baseline", "binary", 200, 2.0, 1),
            _row("raybatch", "baseline", "binary", 100, 1.0, 2),
            _row("raybatch", "this", "binary", 200, 1.0, 2)]
    [r] = ratios(rows)
    assert r["req_s_ratio"] == pytest.approx(1.0)
    assert r["c1_p50_speed_ratio"] == pytest.approx(1.5)
    assert r["rounds"] == 2


def test_a_shape_measured_on_one_side_only_has_no_ratio_and_errors_are_shown():
    rows = [_row("raybatch.inproc", "this", "json", 100, 1.0),
            {"shape": "raybatch", "version": "this", "kind": "binary", "round": 1,
             "request": "OIP binary", "error": "wrong answer, not timed: x"}]
    assert ratios(rows) == []
    assert "wrong answer" in render(rows, [])


def test_the_baseline_is_required():
    with pytest.raises(SystemExit):
        parse_args([])
