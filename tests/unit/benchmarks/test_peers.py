"""benchmarks.peers' pure parts: /proc accounting, wrk's output, answers, ratios, table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.common.wrk import MARK, parse_summary
from benchmarks.peers.measure import (
    Proc,
    cpu_us_per_request,
    mean_batch,
    parse_latency_distribution,
    parse_stat,
    server_cpu_s,
    server_pids,
)
from benchmarks.peers.report import render, targets, with_ratios
from benchmarks.peers.systems import decode_oip, oip_variants


def stat_line(pid: int, name: str, ppid: int, sid: int, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return (f"{pid} ({name}) S {ppid} {pid} {sid} 0 -1 4194560 100 0 0 0 {utime} {stime} "
            "0 0 20 0 4 0 1000 0 0")


# -- /proc ------------------------------------------------------------------------------------
def test_a_stat_line_is_read_past_a_name_with_spaces_and_parentheses():
    p = parse_stat(stat_line(42, "ray::Serve (x) Replica", 7, 40, 250, 50), clk_tck=100)
    assert p == Proc(ppid=7, sid=40, cpu_s=3.0)


def test_the_server_is_its_session_and_every_descendant_and_nothing_else():
    procs = {
        100: Proc(1, 100, 1.0),    # the server, a session leader
        101: Proc(100, 100, 1.0),  # its child
        102: Proc(101, 555, 1.0),  # a grandchild that started a session of its own
        103: Proc(1, 100, 1.0),    # reparented to init, still in the session
        104: Proc(103, 104, 1.0),  # below the reparented one
        200: Proc(1, 200, 5.0),    # the load generator: another session
        201: Proc(200, 200, 5.0),
    }
    assert server_pids(procs, 100) == {100, 101, 102, 103, 104}
    assert server_cpu_s(procs, 100) == pytest.approx(5.0)


def test_a_root_that_exited_still_names_the_children_it_left_in_its_session():
    procs = {301: Proc(1, 300, 1.0), 302: Proc(301, 300, 1.0), 400: Proc(1, 400, 1.0)}
    assert server_pids(procs, 300) == set()  # the root's session is not known from itself
    assert server_pids(procs, 300, sid=300) == {301, 302}


def test_cpu_per_request_counts_growth_newborns_and_not_a_reused_pid_twice():
    before = {10: Proc(1, 10, 1.0), 11: Proc(10, 10, 2.0), 12: Proc(10, 10, 9.0),
              99: Proc(1, 99, 0.0)}
    after = {10: Proc(1, 10, 1.5),   # +0.5 s
             11: Proc(10, 10, 2.25),  # +0.25 s
             12: Proc(10, 77, 0.25),  # pid 12 reused by another session's process: all new
             13: Proc(10, 10, 0.5),   # born in the window: all of it
             99: Proc(1, 99, 50.0)}   # not the server's
    assert cpu_us_per_request(before, after, 10, 1000) == pytest.approx(1500.0)
    assert cpu_us_per_request(before, after, 10, 0) is None


def test_mean_batch_is_items_over_batches_between_two_counts():
    assert mean_batch((10, 100), (20, 740)) == pytest.approx(64.0)
    assert mean_batch(None, (20, 740)) is None
    assert mean_batch((20, 740), (20, 740)) is None


# -- wrk --------------------------------------------------------------------------------------
WRK_OUT = """Running 8s test @ http://127.0.0.1:18301/inference
  1 threads and 128 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     8.23ms    2.10ms  40.02ms   80.00%
  Latency Distribution
     50%    7.78ms
     75%  812.00us
     90%   12.11ms
     99%    1.20s
  121560 requests in 8.00s, 120.00MB read
Requests/sec:  15195.00
""" + MARK + ('{"requests": 121560, "duration_us": 8000000, "bytes": 1, "p50_us": 7780, '
              '"p90_us": 12110, "p99_us": 1200000, "mean_us": 8230.0, "max_us": 40020, '
              '"status_errors": 0, "socket_errors": 0}\n')


def test_the_latency_distribution_block_is_read_in_milliseconds():
    assert parse_latency_distribution(WRK_OUT) == {50.0: 7.78, 75.0: 0.812, 90.0: 12.11,
                                                   99.0: 1200.0}
    assert parse_latency_distribution("Requests/sec: 1\n") == {}


def test_the_summary_and_the_distribution_agree_on_the_same_run():
    r = parse_summary(WRK_OUT, 128, 0.0)
    dist = parse_latency_distribution(WRK_OUT)
    assert r.throughput_rps == pytest.approx(15195.0)
    assert (r.p50_ms, r.p99_ms) == (dist[50.0], dist[99.0])


# -- answers ----------------------------------------------------------------------------------
def test_oip_answers_decode_from_binary_and_from_json():
    y = np.arange(512, dtype=np.float32).reshape(2, 256)
    header = json.dumps({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 256],
                                      "parameters": {"binary_data_size": y.nbytes}}]}).encode()
    got = decode_oip({"inference-header-content-length": str(len(header))},
                     header + y.tobytes())
    assert np.array_equal(got, y)
    doc = {"outputs": [{"name": "OUTPUT0", "shape": [2, 256], "data": y.ravel().tolist()}]}
    assert np.array_equal(decode_oip({}, json.dumps(doc).encode()), y)


def test_raybatch_and_triton_get_the_same_request_bytes():
    x = np.ones((1, 256), dtype=np.float32)
    rb, tr = oip_variants("raybatch", "R", x), oip_variants("triton", "T", x)
    assert [(v.body, v.headers) for v in rb] == [(v.body, v.headers) for v in tr]
    assert [v.kind for v in rb] == ["binary", "json"]


# -- table ------------------------------------------------------------------------------------
def window(rps: float, p50: float = 1.0, cpu: float = 100.0) -> dict:
    return {"throughput_rps": rps, "p50_ms": p50, "p99_ms": 2 * p50, "errors": 0,
            "server_cpu_us_per_req": cpu, "mean_batch": 60.0, "loadavg": [1.5, 1.0, 1.0]}


def row(system: str, kind: str, rps: float, p50_c1: float = 1.0, **extra) -> dict:
    return {"system": system, "title": system, "request": kind, "kind": kind,
            "c128": window(rps), "c1": window(300.0, p50=p50_c1), **extra}


ROWS = [row("raybatch", "binary", 9000.0, p50_c1=0.4), row("raybatch", "json", 6000.0),
        row("triton", "binary", 15000.0, p50_c1=2.9), row("triton", "json", 6000.0),
        row("mosec", "binary", 30000.0, p50_c1=3.7), row("serve.batch", "binary", 3000.0),
        {"system": "litserve", "title": "LitServe", "request": "JSON", "kind": "json",
         "error": "wrong answer, not timed: max |diff| 3"}]


def test_each_ratio_is_raybatchs_rate_of_the_same_kind_over_the_rows():
    by = {(r["system"], r["kind"]): r["raybatch_over_it"] for r in with_ratios(ROWS)}
    assert by[("triton", "binary")] == pytest.approx(0.6)
    assert by[("triton", "json")] == pytest.approx(1.0)
    assert by[("mosec", "binary")] == pytest.approx(0.3)
    assert by[("serve.batch", "binary")] == pytest.approx(3.0)
    assert by[("raybatch", "binary")] == pytest.approx(1.0)
    assert by[("litserve", "json")] is None  # not timed: no ratio


def test_targets_are_judged_from_the_same_rows():
    t = {x["target"]: x for x in targets(ROWS)}
    assert t["Raybatch OIP binary ÷ Triton OIP binary (req/s, C=128) >= 1.0"]["met"] is False
    assert t["Raybatch OIP JSON ÷ Triton OIP JSON (req/s, C=128) >= 1.0"]["met"] is True
    assert t["Raybatch OIP binary ÷ @serve.batch (req/s, C=128) >= 3.0"]["met"] is True
    assert t["Raybatch OIP binary C=1 p50 <= mosec msgpack's"]["met"] is True
    missing = targets([r for r in ROWS if r["system"] != "triton"])
    assert {x["met"] for x in missing if "Triton" in x["target"]} == {None}


def test_the_table_shows_a_wrong_answer_instead_of_numbers():
    table = render(ROWS)
    line = next(x for x in table.splitlines() if x.startswith("| LitServe"))
    assert "wrong answer, not timed" in line and "0.60×" in table
    assert "| 9,000 |" in table and "0.30×" in table


def test_the_shipped_shape_is_judged_against_the_in_process_shortcut_and_the_peers():
    """`raybatch` is the demo as shipped (a batching actor and a replica actor);
    `raybatch.inproc` the in-process shortcut, measured in the same run."""
    rows = [*ROWS, row("raybatch.inproc", "binary", 10000.0, p50_c1=0.2),
            row("raybatch.inproc", "json", 9000.0)]
    t = {x["target"]: x for x in targets(rows)}
    shape = t["actor shape ÷ in-process shape, OIP binary (req/s, C=128) >= 0.9"]
    assert shape["value"] == pytest.approx(0.9) and shape["met"] is True
    assert t["actor shape OIP binary ÷ mosec msgpack (req/s, C=128) >= 1.2"]["met"] is False
    assert t["actor shape OIP JSON ÷ Triton OIP JSON (req/s, C=128) >= 1.5"]["met"] is False
    assert t["actor shape OIP binary C=1 p50 <= 1.0 ms"]["met"] is True
    lone = t["actor shape ÷ in-process shape, OIP binary C=1 p50 <= 1.25"]
    assert lone["value"] == pytest.approx(2.0) and lone["met"] is False
    by = {(r["system"], r["kind"]): r["raybatch_over_it"] for r in with_ratios(rows)}
    assert by[("raybatch.inproc", "binary")] == pytest.approx(0.9)
    assert "| actor shape OIP binary C=1 p50 <= 1.0 ms | 0.40 ms | yes |" in render(rows)
    assert {x["met"] for x in targets(ROWS) if "in-process" in x["target"]} == {None}


def test_the_engine_in_the_ingress_keeps_the_replica_actor_and_drops_the_batching_actor(
        tmp_path):
    """`raybatch.ingress-engine`: the demo's mlp with its engine in the ingress and its model
    still in a replica actor, in a config file of its own beside the shipped shape's."""
    import yaml

    from benchmarks.peers.systems import INGRESS_ENGINE, SYSTEMS, raybatch_config, starters

    shipped = raybatch_config(tmp_path)
    bound = raybatch_config(tmp_path, override=INGRESS_ENGINE)
    assert bound != shipped and shipped.exists()
    (mlp,) = yaml.safe_load(bound.read_text())["models"]
    (demo,) = yaml.safe_load(shipped.read_text())["models"]
    assert mlp["batcher"]["placement"] == "ingress" and mlp["batcher"].get("group") is None
    assert demo["batcher"].get("placement", "actor") == "actor"
    assert not mlp["replicas"].get("in_process", False)
    assert mlp["replicas"] == demo["replicas"] and mlp["batching"] == demo["batching"]
    assert "raybatch.ingress-engine" in SYSTEMS and "raybatch.ingress-engine" in starters()
