"""Raybatch beside Triton, mosec, Ray Serve's `@serve.batch` and LitServe: one table.

    python -m benchmarks.peers [--systems raybatch raybatch.inproc raybatch.ingress-engine
                                triton mosec serve.batch litserve]
        [--duration 8] [--skip-install] [--json OUT] [--results DIR] [--port 18300]

The same model (mlp 256→1024→256, one torch thread, one instance, max batch 64, 2 ms
delay) and the same load for every system in turn: `wrk`, one thread, 128 keep-alive
connections for `--duration` seconds (after a 2 s warm-up), then one connection for
the same time (p50 at C=1). Each system runs alone, started and stopped by this
command under the machine lock (/tmp/raybatch-ray.lock, taken per system; when this
command already runs under `flock` on it, the inherited lock is used). Before and after
each timed run, one answer of each request kind is decoded and compared with the
model's own output (Raybatch's `MLP`, seed 0, `numpy.allclose`); a system that answers
wrong is reported so and not timed further. Peers are installed in `.peers/venv`
(`benchmarks.peers.install`), never in the project's venv.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.results import save_json
from benchmarks.peers import install
from benchmarks.peers.measure import WrongAnswer, check_answer, run_wrk, timed_window
from benchmarks.peers.report import render, targets, with_ratios
from benchmarks.peers.systems import (
    PORT_OFFSET,
    SYSTEMS,
    Server,
    log_tail,
    model_input_and_answer,
    starters,
    stop,
)

LOCK = "/tmp/raybatch-ray.lock"
WARMUP_S = 2.0


def progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@contextmanager
def machine_lock(path: str = LOCK) -> Iterator[None]:
    """The machine lock, unless this process already holds it through an inherited fd
    (`flock /tmp/raybatch-ray.lock python -m benchmarks.peers`)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                yield
                return
        except OSError:
            continue
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for the machine lock {path}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure_server(server: Server, expected: np.ndarray, duration_s: float,
                   concurrencies: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every variant of a started server: checked, warmed, timed per C, checked again."""
    rows = []
    for v in server.variants:
        row: dict[str, Any] = {"system": v.system, "title": v.title, "request": v.request,
                               "kind": v.kind}
        rows.append(row)
        url = server.base_url + v.path
        try:
            check_answer(url, v.body, v.headers, v.decode, expected)
            for c in concurrencies:
                run_wrk(url, v.body, v.headers, c, WARMUP_S if c > 1 else 1.0)
                w = timed_window(url, v.body, v.headers, c, duration_s, server.proc.pid,
                                 server.stats)
                check_answer(url, v.body, v.headers, v.decode, expected)
                row["c128" if c == max(concurrencies) else f"c{c}"] = asdict(w)
                progress(f"{v.system:<12} {v.request:<26} C={c:<4} {w.throughput_rps:>8,.0f} "
                         f"req/s p50 {w.p50_ms:6.2f} ms p99 {w.p99_ms:6.2f} ms server "
                         f"{w.server_cpu_us_per_req or 0:5.0f} us/req batch "
                         f"{w.mean_batch or 0:4.1f} errors {w.errors} load {w.loadavg[0]:.2f}")
        except WrongAnswer as e:
            row["error"] = f"wrong answer, not timed: {e}"
            progress(f"{v.system} {v.request}: {row['error']}")
    return rows


def run_system(name: str, x: np.ndarray, expected: np.ndarray, peers: install.PeerEnv,
               args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, starter in enumerate(starters(tuple(args.triton_arg))[name]):
        with machine_lock():
            t0 = time.monotonic()
            try:
                server = starter(x, args.port + PORT_OFFSET[name], tmp, peers)
            except Exception as e:  # a peer that does not start is a row, not a crash
                progress(f"{name}: did not start: {e}")
                rows.append({"system": name, "title": name, "request": f"server {i + 1}",
                             "kind": "none", "error": f"did not start: {str(e)[:300]}"})
                continue
            progress(f"{server.name}: ready in {time.monotonic() - t0:.0f} s")
            try:
                rows += measure_server(server, expected, args.duration,
                                       tuple(sorted(set(args.concurrency), reverse=True)))
            finally:
                stop(server)
                if args.keep_logs:
                    progress(f"{server.name} log tail:\n{log_tail(server.log)}")
    return rows


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "kernel": platform.release()}


def loads(avg: Any) -> str:
    return " / ".join(f"{v:.2f}" for v in avg)


def write_results(folder: Path, results: dict[str, Any], table: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    m = results["machine"]
    (folder / "README.md").write_text(
        "# Raybatch beside Triton, mosec, `@serve.batch` and LitServe\n\n"
        f"Date: {results['date']}. Machine: {m['nproc']} CPUs ({m['cpu_model']}), Python "
        f"{m['python']}, kernel {m['kernel']}; load average (1, 5, 15 min) "
        f"{loads(results['loadavg_start'])} at the start, {loads(results['loadavg_end'])} at the "
        "end, and per timed run in the table's load column "
        "(the machine is shared: other sessions' work counts in it).\n\n"
        f"Command: `{results['command']}`\n\n"
        "Model: mlp 256→1024→256 (Raybatch's demo `MLP`, seed 0, rebuilt with the same "
        "weights for the peers), one torch thread, one instance, max batch 64, 2 ms. "
        f"Load: wrk, one thread, C=128 for {results['duration_s']:.0f} s after a 2 s warm-up,"
        f" then C=1 for {results['duration_s']:.0f} s. Server CPU: user+system time of the "
        "server's whole process tree over the window, per answered request. Every answer "
        "was checked against the model's own output before and after each timed run.\n\n"
        f"Peers: {json.dumps(results['peer_versions'])}\n\n{table}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--duration", type=float, default=8.0, metavar="S",
                    help="seconds per timed run (default 8)")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[128, 1], metavar="C",
                    help="wrk connections per timed run (default 128 1; the largest is the "
                         "ratios' column)")
    ap.add_argument("--skip-install", action="store_true",
                    help="reuse the peers' venv as it is (no pip)")
    ap.add_argument("--peers-dir", type=Path, default=install.DEFAULT_DIR,
                    help="where the peers' venv lives (default .peers, gitignored)")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON here")
    ap.add_argument("--results", type=Path, metavar="DIR",
                    help="write README.md (machine, command, table) and results.json here")
    ap.add_argument("--port", type=int, default=18300, help="first of the ports used")
    ap.add_argument("--triton-arg", action="append", default=[], metavar="OPT",
                    help="one more tritonserver option, e.g. --triton-arg=--http-thread-count=4 "
                         "(repeatable)")
    ap.add_argument("--keep-logs", action="store_true", help="print each server's log tail")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    peer_systems = set(args.systems) - {"raybatch", "raybatch.inproc", "raybatch.ingress-engine",
                                          "serve.batch"}
    progress("installing the peers in " + str(args.peers_dir / "venv")
             if peer_systems and not args.skip_install else "peers' venv as it is")
    peers = (install.ensure(args.peers_dir, args.skip_install) if peer_systems
             else install.PeerEnv(args.peers_dir))
    x, expected = model_input_and_answer()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m benchmarks.peers " + " ".join(argv if argv is not None
                                                           else sys.argv[1:]),
        "machine": machine(), "loadavg_start": os.getloadavg(), "duration_s": args.duration,
        "peer_versions": install.versions(peers) if peer_systems else {}, "rows": []}
    with tempfile.TemporaryDirectory(prefix="raybatch-peers-") as tmp:
        for name in [s for s in SYSTEMS if s in args.systems]:
            results["rows"] += run_system(name, x, expected, peers, args, Path(tmp))
    results["loadavg_end"] = os.getloadavg()
    results["rows"] = with_ratios(results["rows"])
    results["targets"] = targets(results["rows"])
    table = render(results["rows"])
    print(table)
    print(f"\nload average {loads(results['loadavg_start'])} -> {loads(results['loadavg_end'])} on "
          f"{results['machine']['nproc']} CPUs ({results['machine']['cpu_model']})")
    save_json(args.json, results)
    if args.results:
        write_results(args.results, results, table)


if __name__ == "__main__":
    main()
