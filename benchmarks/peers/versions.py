"""This checkout's Raybatch against an earlier version's, both shapes, alternated in one run.

    python -m benchmarks.peers.versions --baseline DIR [--rounds 2] [--duration 8]
        [--shapes raybatch raybatch.inproc] [--json OUT]

Why: a change that is meant to keep speed (a restructure, a new wire record) is checked
against the version before it on the same machine, in the same minutes, so the machine's
other load falls on both alike. `DIR` is a checkout of the earlier version (a
`git worktree add DIR <commit>`, its C extensions built in place: `python setup.py
build_ext --inplace` there); each server runs from its own checkout (`raybatch up` with
that checkout's demo config cut to its mlp, as `benchmarks.peers` starts it). Each round
runs, for each shape, this checkout's then the baseline's (the order flips each round),
with the same load and answer checks as `benchmarks.peers` (wrk, C=128 then C=1, every
answer compared with the model's own before and after each timed run). The table gives
each run and, per shape and request kind, this version's req/s over the baseline's
(the sum over rounds).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.results import save_json
from benchmarks.peers import install
from benchmarks.peers.__main__ import machine, machine_lock, measure_server, progress
from benchmarks.peers.systems import PORT_OFFSET, REPO, model_input_and_answer, start_raybatch, stop

SHAPES = ("raybatch", "raybatch.inproc")


def run_one(shape: str, repo: Path, label: str, x: Any, expected: Any, args: argparse.Namespace,
            tmp: Path) -> list[dict[str, Any]]:
    """One server of `shape` from `repo`, measured; its rows tagged with `label`."""
    port = args.port + PORT_OFFSET[shape] + (50 if label == "baseline" else 0)
    with machine_lock():
        t0 = time.monotonic()
        server = start_raybatch(x, port, tmp, install.PeerEnv(args.peers_dir),
                                inproc=shape.endswith("inproc"), repo=repo,
                                name=f"{shape}@{label}")
        progress(f"{server.name}: ready in {time.monotonic() - t0:.0f} s")
        try:
            rows = measure_server(server, expected, args.duration, (128, 1))
        finally:
            stop(server)
    return [{**r, "shape": shape, "version": label} for r in rows]


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape and request kind: this version's req/s (C=128) over the baseline's, and
    the same for the C=1 p50 (baseline's over this one's: above 1 is faster)."""
    out = []
    for shape in SHAPES:
        for kind in ("binary", "json"):
            mine = [r for r in rows if r["shape"] == shape and r["kind"] == kind
                    and r["version"] == "this" and "c128" in r]
            base = [r for r in rows if r["shape"] == shape and r["kind"] == kind
                    and r["version"] == "baseline" and "c128" in r]
            if not mine or not base:
                continue
            rps = (sum(r["c128"]["throughput_rps"] for r in mine)
                   / sum(r["c128"]["throughput_rps"] for r in base))
            p50 = (sum(r["c1"]["p50_ms"] for r in base) / sum(r["c1"]["p50_ms"] for r in mine))
            out.append({"shape": shape, "kind": kind, "rounds": min(len(mine), len(base)),
                        "req_s_ratio": rps, "c1_p50_speed_ratio": p50})
    return out


def render(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> str:
    lines = ["| round | shape | version | request | req/s, C=128 | p50 ms, C=1 | load |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['round']} | {r['shape']} | {r['version']} | {r['request']} "
                         f"| {r['error']} | – | – |")
            continue
        a, b = r["c128"], r["c1"]
        lines.append(f"| {r['round']} | {r['shape']} | {r['version']} | {r['request']} "
                     f"| {a['throughput_rps']:,.0f} | {b['p50_ms']:.2f} | {a['loadavg'][0]:.2f} |")
    lines += ["", "| shape | request | this ÷ baseline, req/s | baseline ÷ this, C=1 p50 |",
              "|---|---|---|---|"]
    lines += [f"| {s['shape']} | {s['kind']} | {s['req_s_ratio']:.3f} | "
              f"{s['c1_p50_speed_ratio']:.3f} |" for s in summary]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True,
                    help="a checkout of the earlier version, its extensions built in place")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=8.0, metavar="S")
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--peers-dir", type=Path, default=install.DEFAULT_DIR)
    ap.add_argument("--json", metavar="OUT")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    baseline = args.baseline.resolve()
    if not (baseline / "deployments").is_dir():
        sys.exit(f"{baseline} is not a Raybatch checkout (no deployments/ in it)")
    x, expected = model_input_and_answer()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="raybatch-versions-") as tmp:
        for k in range(args.rounds):
            order = [("this", REPO), ("baseline", baseline)]
            for shape in args.shapes:
                for label, repo in (order if k % 2 == 0 else order[::-1]):
                    rows += [{**r, "round": k + 1}
                             for r in run_one(shape, repo, label, x, expected, args, Path(tmp))]
    summary = ratios(rows)
    print(render(rows, summary))
    print(f"\nload average now {' / '.join(f'{v:.2f}' for v in os.getloadavg())}")
    save_json(args.json, {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "command": "python -m benchmarks.peers.versions "
                                     + " ".join(argv if argv is not None else sys.argv[1:]),
                          "machine": machine(), "baseline": str(baseline), "rows": rows,
                          "summary": summary})


if __name__ == "__main__":
    main()
