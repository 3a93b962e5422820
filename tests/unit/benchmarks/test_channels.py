"""benchmarks.serve.channels' pieces without Ray: its arguments, the percentile summary, the
table, and the out-of-band variant of the link between two real sockets."""

from __future__ import annotations

import asyncio
import socket
import threading

import numpy as np
import pytest

from benchmarks.serve import channels


def test_the_arguments_default_to_every_transport_and_fewer_calls_for_the_big_batch():
    args = channels.parse_args([])
    assert args.transports == list(channels.TRANSPORTS) and args.json is None
    assert [channels.calls_for(args, r, c) for r, c in channels.SIZES] == [1000, 1000, 200]
    args = channels.parse_args(["--calls", "30", "--transports", "link", "graph"])
    assert args.calls == 30 and args.transports == ["link", "graph"]
    with pytest.raises(SystemExit):
        channels.parse_args(["--transports", "carrier-pigeon"])
    with pytest.raises(SystemExit):
        channels.parse_args(["--big-calls", "0"])


def test_the_summary_takes_nearest_rank_percentiles_in_microseconds():
    s = channels.summarize([i / 1e6 for i in range(100, 0, -1)])  # 1..100 µs, any order
    assert s["p50_us"] == pytest.approx(50) and s["p99_us"] == pytest.approx(99)
    assert s["mean_us"] == pytest.approx(50.5)
    assert channels.summarize([2e-6])["p99_us"] == pytest.approx(2)
    with pytest.raises(ValueError):
        channels.summarize([])


def test_the_table_groups_by_size_and_says_why_a_transport_failed():
    ok = {"p50_us": 1234.4, "p99_us": 2000, "caller_cpu_us": 10, "replica_cpu_us": 20.2}
    rows = [{"transport": "actor", "rows": 64, "cols": 16384, **ok},
            {"transport": "actor", "rows": 1, "cols": 256, **ok},
            {"transport": "graph", "rows": 1, "cols": 256, "error": "ValueError: no"},
            {"transport": "local", "rows": 64, "cols": 256, **ok, "replica_cpu_us": None}]
    lines = channels.table(rows).splitlines()
    assert lines[0].startswith("| batch | transport | p50 µs | p99 µs |")
    assert all(line.count("|") == 7 for line in lines)
    assert lines[2] == "| 1 × 256 (1 KiB) | Ray actor call | 1,234 | 2,000 | 10 | 20 |"
    assert "failed: ValueError: no" in lines[3]
    assert lines[4].startswith("| 64 × 256 (64 KiB) | no hop") and lines[4].endswith("| 10 | - |")
    assert lines[5].startswith("| 64 × 16384 (4 MiB) |")


def test_large_arrays_travel_out_of_band_and_small_ones_inside_the_pickle():
    big, small = np.ones((64, 16384), np.float32), np.ones((1, 256), np.float32)
    parts = channels.oob_parts((big,))
    assert len(parts) == 2 and parts[1].nbytes == big.nbytes
    assert np.shares_memory(np.frombuffer(parts[1], np.float32), big)  # not copied
    assert len(channels.oob_parts((small,))) == 1


def test_advance_drops_what_was_sent_across_pieces():
    views = [memoryview(b"abc"), memoryview(b"defg")]
    assert [bytes(v) for v in channels.advance(views, 0)] == [b"abc", b"defg"]
    assert [bytes(v) for v in channels.advance(views, 4)] == [b"efg"]
    assert channels.advance(views, 7) == []


def test_the_out_of_band_link_answers_each_call_with_the_replicas_answer():
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        sock, _ = listener.accept()
        channels.serve_oob(sock, lambda x: x * 2)

    server = threading.Thread(target=accept, daemon=True)
    server.start()

    async def calls() -> None:
        link = await channels.OobLink.open_to(*listener.getsockname()[:2])
        for rows, cols in channels.SIZES:
            x = np.random.default_rng(rows).random((rows, cols), dtype=np.float32)
            for _ in range(3):
                got = await link.call(x)
                assert got.dtype == np.float32 and np.array_equal(got, x * 2)
        link.close()

    asyncio.run(calls())
    server.join(5)
    listener.close()
    assert not server.is_alive()  # the caller's close ends the replica's thread
