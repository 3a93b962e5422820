"""How long `raybatch up` takes to be ready, and where the CPU of its start goes.

    python -m benchmarks.placement.startup [--runs N] [-- raybatch up arguments...]

Starts `raybatch up` (default arguments: `--port 8300`, the demo config), waits until it
prints "Stop with Ctrl-C", and reports: the time to ready, the CPU seconds of every
process it started (from /proc: the driver, Ray's own processes, Serve's, the ingress,
batching actors, replica actors), when each started, and the machine's busy share per
second meanwhile (whether the start is CPU-bound or waits). Then it stops the app with
Ctrl-C. Run it on a quiet machine, under the Ray lock where others share it; compare
configs in alternation, since one run moves by 1-2 s with the load.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[int, int, str, int]]:
    """pid -> (CPU ticks, start time in ticks since boot, command line, parent pid)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        name = cmd or stat.split("(")[1].split(")")[0]
        out[int(pid)] = (int(f[11]) + int(f[12]), int(f[19]), name, int(f[1]))
    return out


def descendants(root: int, table: dict[int, tuple[int, int, str, int]]) -> set[int]:
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, (_, _, _, parent) in table.items():
            if pid not in mine and parent in mine:
                mine.add(pid)
                grew = True
    return mine


def label(cmd: str) -> str:
    first = cmd.split()[0]
    if first.startswith("ray::"):
        return first
    return " ".join(cmd.split()[:3])[-60:] if "python" in first else first.split("/")[-1]


def one_run(argv: list[str]) -> float:
    before = set(processes())
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    busy: list[int] = []
    done = threading.Event()

    def sample() -> None:
        prev = None
        while not done.is_set():
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            now = (sum(v) - v[3] - v[4], sum(v))
            if prev:
                busy.append(round(100 * (now[0] - prev[0]) / max(now[1] - prev[1], 1)))
            prev = now
            done.wait(1.0)

    threading.Thread(target=sample, daemon=True).start()
    try:  # whatever happens here (a closed pipe on our stdout...), the app is stopped
        return _report(proc, before, t0, busy, done)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _report(proc: subprocess.Popen, before: set[int], t0: float, busy: list[int],
            done: threading.Event) -> float:
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Stop with Ctrl-C" in line:
            break
    else:
        done.set()
        raise SystemExit(f"raybatch up ended (exit {proc.wait()}) before it was ready")
    ready = time.monotonic() - t0
    done.set()
    table = processes()
    mine = {p: v for p, v in table.items() if p in descendants(proc.pid, table)
            and p not in before}
    cpu = collections.Counter()
    for ticks, _, cmd, _ in mine.values():
        cpu[label(cmd)] += ticks / HZ
    print(f"ready after {ready:.1f} s; CPU of the processes it started {sum(cpu.values()):.1f} s;"
          f" load {os.getloadavg()[0]:.2f}")
    print("busy % of all cores, per second:", " ".join(map(str, busy)))
    for name, seconds in cpu.most_common():
        print(f"  {seconds:6.2f} s  {name}")
    rows = sorted((start, ticks, cmd) for ticks, start, cmd, _ in mine.values())
    for start, ticks, cmd in rows:
        print(f"  started +{(start - rows[0][0]) / HZ:5.1f} s  cpu {ticks / HZ:5.2f} s  "
              f"{cmd[:70]}", flush=True)
    return ready


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("up_args", nargs="*", help="arguments of `raybatch up` (after --)")
    args = ap.parse_args()
    argv = [str(Path(sys.executable).parent / "raybatch"), "up",
            *(args.up_args or ["--port", "8300"])]
    times = [one_run(argv) for _ in range(args.runs)]
    print("ready after (s):", ", ".join(f"{t:.1f}" for t in times))


if __name__ == "__main__":
    main()
