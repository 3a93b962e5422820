"""The simulator against cases whose answer is known in closed form."""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching.dynamic.policy import DynamicPolicy, QueuePolicy
from batching.simulate import Bursts, ClosedLoop, Poisson, Trace, simulate
from batching.simulate.cli import add_arguments, run
from batching.simulate.report import histogram

A, B = 0.002, 0.00005  # a batch takes 2 ms + 0.05 ms per item
ROOT = Path(__file__).resolve().parents[4]


def policy(**kw) -> DynamicPolicy:
    return DynamicPolicy(**{"max_batch_size": 64, **kw})


def test_one_closed_loop_client_runs_back_to_back():
    r = simulate(policy(max_batch_size=1), ClosedLoop(1), latency_a_s=A, latency_b_s=0.0,
                 duration_s=1.0)
    assert r.throughput_rps == pytest.approx(500.0)
    assert r.latency_ms["p50"] == pytest.approx(2.0)
    assert r.latency_ms["max"] == pytest.approx(2.0)
    assert r.batch_sizes == {1: 500}
    assert r.flush_reasons == {"full": 500}
    assert r.utilization == pytest.approx(1.0)
    assert (r.arrived, r.completed, r.failed, r.unfinished) == (500, 500, {}, 0)


def test_pipelined_closed_loop_reaches_the_replica_ceiling():
    r = simulate(policy(), ClosedLoop(128), latency_a_s=A, latency_b_s=B, max_inflight=2,
                 duration_s=1.0)
    ceiling = 64 / (A + 64 * B)  # 12.3k items/s
    assert 0.99 * ceiling <= r.throughput_items_per_s <= ceiling
    assert set(r.batch_sizes) == {64}
    # Each request waits for the other batch, then its own: 2 x 5.2 ms.
    assert r.latency_ms["p50"] == pytest.approx(10.4)


def test_pipelining_hides_the_hop_to_the_replica():
    def items_per_s(max_inflight: int) -> float:
        return simulate(policy(), ClosedLoop(128), latency_a_s=A, latency_b_s=B, hop_s=0.0005,
                        max_inflight=max_inflight, duration_s=0.5).throughput_items_per_s

    assert items_per_s(1) == pytest.approx(64 / (A + 64 * B + 0.001), rel=0.02)
    assert items_per_s(2) == pytest.approx(64 / (A + 64 * B), rel=0.02)


def test_filling_while_busy_makes_pipelined_batches_fuller_and_requests_faster():
    """Poisson arrivals at 90% of the ceiling, two pipeline slots: without the option the
    delay sends a small batch into the second slot, where it waits out the running one."""
    def run(fill: bool):
        return simulate(policy(max_queue_delay_s=0.002, idle_dispatch=True,
                               fill_while_busy=fill), Poisson(11_000.0), latency_a_s=A,
                        latency_b_s=B, max_inflight=2, hop_s=0.0001, duration_s=2.0,
                        warmup_s=0.5, seed=3)

    held, sent = run(True), run(False)
    assert held.throughput_rps == pytest.approx(sent.throughput_rps, rel=0.02)
    assert held.mean_batch_size > sent.mean_batch_size
    assert held.latency_ms["p50"] < 0.95 * sent.latency_ms["p50"]
    assert (held.failed, held.unfinished) == ({}, 0)


def test_replicas_share_the_load():
    r = simulate(policy(max_batch_size=1), ClosedLoop(4), replicas=2, latency_a_s=A,
                 latency_b_s=0.0, duration_s=0.5)
    assert r.throughput_rps == pytest.approx(1000.0)
    assert r.latency_ms["p50"] == pytest.approx(4.0)  # two requests per replica, in turn


def test_poisson_at_a_low_rate_sees_one_batch_latency():
    r = simulate(policy(), Poisson(20.0), latency_a_s=A, latency_b_s=B, duration_s=5.0)
    assert 60 <= r.arrived <= 140
    assert r.latency_ms["p50"] == pytest.approx(2.05)
    assert r.flush_reasons == {"delay": r.batches}  # no wait asked: sent at once


def test_poisson_rate_is_kept():
    r = simulate(policy(), Poisson(1000.0), latency_a_s=A, latency_b_s=B, duration_s=2.0)
    assert r.arrived == pytest.approx(2000, rel=0.05)
    assert r.throughput_rps == pytest.approx(1000, rel=0.05)


def test_queue_delay_holds_a_lone_request():
    r = simulate(policy(max_queue_delay_s=0.005), Poisson(20.0), latency_a_s=A, latency_b_s=B,
                 duration_s=5.0)
    assert r.flush_reasons == {"delay": r.batches}
    assert r.latency_ms["p50"] == pytest.approx(7.05, abs=0.01)


def test_a_burst_is_one_batch_and_preferred_sizes_split_it():
    r = simulate(policy(), Bursts(32, 0.1), latency_a_s=A, latency_b_s=B, duration_s=1.0)
    assert r.batch_sizes == {32: 10}
    assert r.latency_ms["p50"] == r.latency_ms["max"] == pytest.approx(3.6)

    r = simulate(policy(max_batch_size=32, preferred_batch_sizes=(8, 16)), Bursts(20, 0.1),
                 latency_a_s=A, latency_b_s=B, duration_s=1.0)
    assert r.batch_sizes == {4: 10, 16: 10}
    assert r.flush_reasons == {"delay": 10, "preferred": 10}


def test_a_burst_larger_than_a_batch_waits_for_the_first():
    r = simulate(policy(), Bursts(100, 0.1), latency_a_s=A, latency_b_s=B, duration_s=1.0)
    assert r.batch_sizes == {36: 10, 64: 10}
    assert r.latency_ms["max"] == pytest.approx(5.2 + 3.8)


def test_spread_bursts_stay_inside_their_period():
    times = Bursts(5, 1.0, spread_s=0.5).times(__import__("numpy").random.default_rng(1))
    first = [next(times) for _ in range(10)]
    assert first == sorted(first)
    assert all(0 <= t < 0.5 for t in first[:5]) and all(1 <= t < 1.5 for t in first[5:])


def test_trace_file_arrivals(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("# recorded arrivals\n0.0\n0.010  # late one\n\n0.001\n")
    r = simulate(policy(), Trace.from_file(path), latency_a_s=A, latency_b_s=0.0)
    # 0 runs 0-2 ms; 0.001 waits for the replica and runs 2-4 ms; 0.010 runs 10-12 ms.
    assert (r.arrived, r.completed) == (3, 3)
    assert r.latency_ms["p50"] == pytest.approx(2.0)
    assert r.latency_ms["max"] == pytest.approx(3.0)
    assert r.window_s == pytest.approx(0.012)
    assert r.throughput_rps == pytest.approx(3 / 0.012)


def test_trace_file_names_a_bad_line(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("0.1\nsoon\n")
    with pytest.raises(ValueError, match=r"trace.txt:2: 'soon'"):
        Trace.from_file(path)


def test_expired_and_rejected_requests_are_counted():
    at_once = Trace((0.0,) * 10)
    r = simulate(policy(max_batch_size=1, deadline_admission=False), at_once,
                 latency_a_s=0.010, latency_b_s=0.0, timeout_s=0.025)
    # the third runs 20-30 ms, past its deadline (25 ms): queue deadlines bound the wait
    assert (r.completed, r.failed, r.unfinished) == (3, {"DeadlineExceeded": 7}, 0)
    r = simulate(policy(max_batch_size=1), at_once, latency_a_s=0.010, latency_b_s=0.0,
                 timeout_s=0.025)
    # deadline admission: once the first batch measured the rate (10 ms), every request
    # that would end past 25 ms is shed at once, the third included
    assert (r.completed, r.failed, r.unfinished) == (2, {"Overloaded": 8}, 0)

    bounded = policy(max_batch_size=1, default_queue_policy=QueuePolicy(max_queue_size=4))
    r = simulate(bounded, at_once, latency_a_s=0.010, latency_b_s=0.0)
    assert (r.completed, r.failed) == (4, {"QueueFull": 6})


def test_requests_larger_than_a_batch_are_split_and_joined():
    r = simulate(policy(max_batch_size=16), ClosedLoop(1), latency_a_s=A, latency_b_s=B,
                 items_per_request=40, duration_s=0.4)
    assert r.batch_sizes == {8: 50, 16: 100}
    assert r.latency_ms["p50"] == pytest.approx(3 * 2.0 + 40 * 0.05)
    assert r.throughput_items_per_s == pytest.approx(40 / 0.008)


def test_item_costs_come_from_the_policy_cost_fn():
    priced = policy(max_batch_cost=10.0, cost_fn=lambda item: item)
    r = simulate(priced, ClosedLoop(1), latency_a_s=A, latency_b_s=0.001,
                 make_items=lambda rng: [5.0], duration_s=0.7)
    assert r.latency_ms["p50"] == pytest.approx(2.0 + 5 * 1.0)


def test_warmup_and_request_count_bound_the_measurements():
    r = simulate(policy(max_batch_size=1), ClosedLoop(1), latency_a_s=A, latency_b_s=0.0,
                 duration_s=1.0, warmup_s=0.5)
    assert (r.arrived, r.window_s) == (250, 0.5)
    assert r.throughput_rps == pytest.approx(500.0)

    r = simulate(policy(max_batch_size=4), ClosedLoop(8), latency_a_s=A, latency_b_s=0.0,
                 num_requests=100)
    assert (r.arrived, r.completed, r.batches) == (100, 100, 25)


def test_a_seed_repeats_a_run_exactly():
    def once(seed: int) -> dict:
        return simulate(policy(max_queue_delay_s=0.001), Poisson(3000.0), replicas=2,
                        latency_a_s=A, latency_b_s=B, jitter=0.3, duration_s=0.5,
                        seed=seed).as_dict()

    assert once(7) == once(7)
    assert once(7) != once(8)


def test_endless_arrivals_need_a_limit():
    with pytest.raises(ValueError, match="never end"):
        simulate(policy(), Poisson(10.0), latency_a_s=A, latency_b_s=B)


def test_a_run_past_its_events_stops_with_what_to_ask_for_and_sizes_stay_bounded():
    """A run's memory and time follow its events: past `max_events` it stops with an error
    (not hours later, or out of memory); replicas past the bound, and numbers that are not
    finite, are refused before it starts; a closed loop's clients are not a list."""
    with pytest.raises(ValueError, match=r"the run passed 1,000 events \(arrivals, batches, "
                                         r"timers\) at .* s of virtual time, [\d,]+ requests "
                                         r"sent: ask for fewer requests"):
        simulate(policy(), Poisson(1e9), latency_a_s=A, latency_b_s=B, duration_s=10.0,
                 max_events=1000)
    with pytest.raises(ValueError, match=r"the run passed 1,000 events"):
        simulate(policy(max_batch_size=4), Poisson(10.0), latency_a_s=A, latency_b_s=B,
                 items_per_request=10**9, duration_s=1.0, max_events=1000)
    ok = simulate(policy(), Poisson(1000.0), latency_a_s=A, latency_b_s=B, duration_s=0.1,
                  max_events=1000)
    assert ok.completed > 0  # a run under its bound is untouched by it
    with pytest.raises(ValueError, match=r"replicas=1000000000 must be 1\.\.100,000"):
        simulate(policy(), Poisson(10.0), replicas=10**9, latency_a_s=A, latency_b_s=B,
                 duration_s=1.0)
    for name in ("hop_s", "latency_b_s", "jitter", "timeout_s", "duration_s"):
        with pytest.raises(ValueError, match=rf"{name}=(inf|nan) must be a finite number"):
            simulate(policy(), Poisson(10.0), **{"latency_a_s": A, "latency_b_s": B,
                                                 "duration_s": 1.0, name: float("inf")})
    assert list(itertools.islice(ClosedLoop(10**15).times(None), 3)) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("make, message", [
    (lambda: Trace((0.1, float("nan"))), r"trace time nan is not a finite number of seconds"),
    (lambda: Trace((0.1, float("inf"))), r"trace time inf is not a finite number of seconds"),
    (lambda: Bursts(10, float("inf")), r"burst period_s=inf must be > 0 and finite"),
    (lambda: Bursts(10**9, 0.1), r"burst size=1000000000 must be 1\.\.1,000,000"),
    (lambda: Poisson(float("inf")), r"rate_per_s=inf must be > 0 and finite"),
    (lambda: ClosedLoop(1, think_s=float("nan")), r"think_s=nan must be >= 0 and finite"),
])
def test_arrivals_that_would_never_end_or_not_fit_are_refused(make, message):
    """A nan in a trace or an endless burst period made the run spin forever at one
    instant; a burst of a billion was a list of a billion times."""
    with pytest.raises(ValueError, match=message):
        make()


def test_a_trace_file_with_a_time_that_is_not_finite_names_its_line(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("0.1\n# a comment\ninf\n")
    with pytest.raises(ValueError, match=r"trace\.txt:3: 'inf' is not a time"):
        Trace.from_file(path)
    path.write_text("0.1\n" + "7" * 5000)  # no end of line: /dev/zero is one such line
    with pytest.raises(ValueError, match=r"trace\.txt:2: a line of more than 1,024 characters"):
        Trace.from_file(path)
    with pytest.raises(ValueError, match=r"/dev/zero:1: a line of more than 1,024 characters"):
        Trace.from_file("/dev/zero")  # read a line at a time, not whole


def test_the_cli_says_a_policy_setting_it_refuses_in_one_line(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--rate", "10", "--max-queue-delay-ms", "-1"])) == 2
    err = capsys.readouterr().err
    assert err == ("simulate: max_queue_delay_s: Input should be greater than or equal to "
                   "0\n"), err
    assert run(parser.parse_args(["--rate", "1e9", "--max-events", "500"])) == 2
    assert "the run passed 500 events" in capsys.readouterr().err


def test_timeouts_shorter_than_the_queue_delay_still_get_served():
    r = simulate(policy(max_queue_delay_s=0.05), Poisson(1000.0), latency_a_s=A, latency_b_s=B,
                 timeout_s=0.01, duration_s=0.5)
    assert r.completed > 0


def test_report_text_has_a_histogram():
    r = simulate(policy(), Bursts(100, 0.1), latency_a_s=A, latency_b_s=B, duration_s=0.3)
    text = r.format()
    assert "throughput" in text and "p99" in text
    assert "flush reasons delay 3 (50.0%)  full 3 (50.0%)" in text
    assert "  36 | " + "#" * 40 + " 3" in text.splitlines()


def test_histogram_groups_many_sizes_by_powers_of_two():
    rows = histogram({k: 1 for k in range(1, 41)}, width=8)
    assert [row.split("|")[0].strip() for row in rows] == ["1-1", "2-3", "4-7", "8-15",
                                                           "16-31", "32-63"]
    assert rows[-1].endswith(" 9")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_prints_json(capsys):
    code = run(parse("--concurrency", "1", "--max-batch-size", "1", "--latency-a-ms", "2",
                     "--latency-b-ms", "0", "--duration", "0.5", "--json"))
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["throughput_rps"] == pytest.approx(500.0)
    assert report["flush_reasons"] == {"full": 250}


def test_cli_reads_bursts_preferred_sizes_and_reports_bad_settings(capsys):
    args = parse("--bursts", "20:0.1", "--preferred", "8,16", "--duration", "0.5")
    assert run(args) == 0
    assert "preferred 5 (50.0%)" in capsys.readouterr().out

    assert run(parse("--rate", "10", "--preferred", "64", "--max-batch-size", "8")) == 2
    assert "exceed max_batch_size=8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--bursts", "64")


def test_python_dash_m_runs(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text("0\n0.5\n")
    out = subprocess.run(
        [sys.executable, "-m", "batching.simulate", "--trace", str(trace), "--json"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    assert json.loads(out)["completed"] == 2


def test_timer_tick_makes_a_delay_that_outlives_other_events_fire_late():
    # Poisson arrivals wake the host between a request's arrival and its delay's end;
    # each wake-up rounds the time left up to a whole tick, so the delay runs long.
    kw = dict(latency_a_s=0.001, latency_b_s=0.0, duration_s=4.0)
    exact = simulate(policy(max_queue_delay_s=0.002), Poisson(1000.0), **kw)
    ticked = simulate(policy(max_queue_delay_s=0.002), Poisson(1000.0), timer_tick_s=0.001, **kw)
    assert ticked.latency_ms["p50"] > exact.latency_ms["p50"] + 0.15
    alone = simulate(policy(max_queue_delay_s=0.002), ClosedLoop(1), timer_tick_s=0.001, **kw)
    assert alone.latency_ms["p50"] == pytest.approx(3.0)  # nothing else wakes the host


def test_idle_dispatch_spares_a_lone_client_the_delay_but_not_a_loaded_queue():
    def run(c: int, idle: bool):
        return simulate(policy(max_queue_delay_s=0.005, idle_dispatch=idle), ClosedLoop(c),
                        latency_a_s=A, latency_b_s=B, max_inflight=2, duration_s=1.0)

    waits, goes = run(1, False), run(1, True)
    assert waits.latency_ms["p50"] == pytest.approx(5.0 + 2.05)
    assert goes.latency_ms["p50"] == pytest.approx(2.05)
    assert goes.flush_reasons == {"idle": goes.completed}
    loaded = run(128, True)  # some batch is always in flight: full batches, as without it
    assert loaded.flush_reasons.get("idle", 0) <= 2
    assert loaded.throughput_rps == pytest.approx(run(128, False).throughput_rps, rel=0.02)
