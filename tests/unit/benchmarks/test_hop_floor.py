"""benchmarks.serve.hop_floor runs a real caller and the replica's thread server in two
processes: each batch comes back as it was sent (checked before timing), both sizes are
timed over both transports (TCP, and the Unix socket of a caller on the same node), and the
server process is gone afterwards."""

import re

from benchmarks.serve import hop_floor


def test_a_short_run_times_both_sizes_and_leaves_no_server(capsys):
    hop_floor.main(["--calls", "30"])
    out = capsys.readouterr().out
    rows = re.findall(r"^(TCP|Unix)\s+(\d+) rows\s+p50\s+(\d+) µs", out, re.M)
    assert [(t, r) for t, r, _ in rows] == [("TCP", "1"), ("TCP", "64"), ("Unix", "1"),
                                           ("Unix", "64")], out
    assert all(int(p) > 0 for *_, p in rows), out
    assert "any core; load average" in out
