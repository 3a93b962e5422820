"""benchmarks.serve.hop_floor runs a real caller and the replica's thread server in two
processes: each batch comes back as it was sent (checked before timing), both sizes are
timed, and the server process is gone afterwards."""

import re

from benchmarks.serve import hop_floor


def test_a_short_run_times_both_sizes_and_leaves_no_server(capsys):
    hop_floor.main(["--calls", "30"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\s*(\d+) rows\s+p50\s+(\d+) µs", out, re.M)
    assert [r for r, _ in rows] == ["1", "64"] and all(int(p) > 0 for _, p in rows), out
    assert "any core; load average" in out
