"""The floor under every hop between processes: one round trip on the direct connection
(`deployments.wire.link`) between two plain processes, no Ray.

    python -m benchmarks.serve.hop_floor [--calls 3000] [--one-core]

An asyncio caller (as a batching actor is) sends a batch (1 or 64 rows of 256 FP32) to a
replica-like server (`deployments.replica.link_server`, echoing it) and awaits the answer, one
call after another: the round trip's median, and each process's CPU per call; over TCP on
127.0.0.1 (a caller on another node gets TCP) and over the Unix socket a caller on the
actor's own node gets (`deployments.wire.endpoint`), in turn.
`--one-core` pins both to CPU 0, so a wake-up never crosses cores: the difference is what
a wake-up on the other core costs on this machine (on a VM, an inter-processor interrupt
is an exit to the hypervisor). What it answers: how much of the mission's shape's lone
request (four hops more than the in-process shortcut) is the machine's, whatever the code
on either side does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import numpy as np

CLK_TCK = os.sysconf("SC_CLK_TCK")


def serve() -> None:
    from deployments.replica.link_server import ThreadedLinkServer
    from deployments.wire.endpoint import SAME_NODE

    server = ThreadedLinkServer(lambda items: (items, 0.0), 1)
    for where in ("127.0.0.1", SAME_NODE):
        host, port, token = server.address(where)
        print(host.encode().hex(), port, token.hex(), flush=True)
    sys.stdin.read()  # until the caller closes our stdin


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def measure(calls: int, server: subprocess.Popen, host: str, port: int,
                  token: bytes) -> None:
    from deployments.wire.endpoint import is_unix
    from deployments.wire.link import Link

    link = await Link.open_to(host, port, token)
    for rows in (1, 64):
        x = np.random.default_rng(0).random((rows, 256), dtype=np.float32)
        echoed, _ = await link.call(x)
        if not np.array_equal(echoed, x):  # the answer is checked before anything is timed
            raise RuntimeError(f"the server echoed {echoed!r} for a batch of {rows} rows")
        for _ in range(min(200, calls)):
            await link.call(x)
        took, own, theirs = [], time.process_time(), cpu_s(server.pid)
        for _ in range(calls):
            t0 = time.perf_counter()
            await link.call(x)
            took.append(time.perf_counter() - t0)
        took.sort()
        transport = "Unix" if is_unix(host) else "TCP "
        print(f"{transport} {rows:3d} rows  p50 {took[calls // 2] * 1e6:6.0f} µs  p90 "
              f"{took[calls * 9 // 10] * 1e6:6.0f} µs  CPU caller "
              f"{(time.process_time() - own) / calls * 1e6:5.0f} + server "
              f"{(cpu_s(server.pid) - theirs) / calls * 1e6:5.0f} µs/call", flush=True)
    link.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--one-core", action="store_true", help="pin both processes to CPU 0")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve()
        return
    if args.one_core:
        os.sched_setaffinity(0, {0})  # the server, started below, inherits it
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.serve.hop_floor", "--serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(2):
            host, port, token = server.stdout.readline().split()
            asyncio.run(measure(args.calls, server, bytes.fromhex(host).decode(), int(port),
                                bytes.fromhex(token)))
    finally:
        server.stdin.close()
        server.wait(10)
    print(f"{'one core' if args.one_core else 'any core'}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
