"""One batch's round trip between two actors on one node, over what Ray offers and over the
project's own direct connection: a plain Ray actor call, a Ray compiled graph (its
shared-memory channels), the direct link (`deployments.wire.link` to
`deployments.replica.link_server`, which sends large arrays out of band:
`deployments.wire.codec`), and the benchmark-only variant of the link that the product's
out-of-band frames were built from (arrays as pickle protocol 5 out-of-band buffers, each
received straight into its own buffer, with `sock_recv_into`).

    flock /tmp/raybatch-ray.lock python -m benchmarks.serve.channels [--calls 1000]
        [--big-calls 200] [--transports actor graph link link-oob] [--json OUT]

Why: before the project grows its own transport for tensors (out-of-band buffers, shared
memory), see what Ray's channels give on the same path, and where copies start to matter.
An async caller actor (a batching actor's position) sends a float32 batch (1 x 256,
64 x 256, 64 x 16384: 1 KiB, 64 KiB, 4 MiB) to a sync replica-like actor that answers
`x * 2`, one call at a time, each awaited before the next. Every answer is checked
against numpy during the warm-up and the last one after the timed calls. Reported per
(transport, size): the round trip's p50 and p99, and the CPU per call of the caller's and
of the replica's process (every thread: Ray's own included), read inside each actor
before and after the timed calls. A row "no hop" is `x * 2` in the caller: the floor.
Also printed: the time each transport took to open (the graph's: its compile). Each
transport gets a fresh pair of actors, torn down before the next one starts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pickle
import platform
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import ray

from benchmarks.common.results import save_json

SIZES = ((1, 256), (64, 256), (64, 16384))
TRANSPORTS = ("actor", "graph", "link", "link-oob")
LABELS = {
    "local": "no hop (`x * 2` in the caller)",
    "actor": "Ray actor call",
    "graph": "Ray compiled graph (`execute_async`)",
    "link": "direct link (`deployments.wire.link`)",
    "link-oob": "direct link, pickle-5 out-of-band (variant)",
}
BIG_BYTES = 1 << 20  # a batch past this is timed `--big-calls` times


# -- pure pieces: arguments, summary, table ----------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="timed calls per size")
    p.add_argument("--big-calls", type=int, default=200,
                   help="timed calls for a batch past 1 MiB")
    p.add_argument("--warmup", type=int, default=50, help="checked calls before timing")
    p.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    p.add_argument("--json", metavar="OUT", help="write the rows here as JSON")
    args = p.parse_args(argv)
    if min(args.calls, args.big_calls, args.warmup) < 1:
        p.error("--calls, --big-calls and --warmup must be at least 1")
    return args


def calls_for(args: argparse.Namespace, rows: int, cols: int) -> int:
    return args.big_calls if rows * cols * 4 > BIG_BYTES else args.calls


def summarize(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 (nearest rank) and mean of round trips given in seconds, in µs."""
    s = sorted(latencies_s)
    if not s:
        raise ValueError("no round trips to summarize")

    def rank(q: float) -> float:
        return s[max(0, math.ceil(q * len(s)) - 1)] * 1e6

    return {"p50_us": rank(0.50), "p99_us": rank(0.99), "mean_us": sum(s) / len(s) * 1e6}


def size_label(rows: int, cols: int) -> str:
    n = rows * cols * 4
    unit = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"
    return f"{rows} × {cols} ({unit})"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown, one line per (transport, size), grouped by size; a failed one says why."""
    out = ["| batch | transport | p50 µs | p99 µs | caller CPU µs/call | "
           "replica CPU µs/call |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["rows"] * r["cols"]):  # stable: transport order
        head = f"| {size_label(r['rows'], r['cols'])} | {LABELS[r['transport']]} |"
        if "error" in r:
            out.append(f"{head} failed: {r['error']} | | | |")
        else:
            out.append(f"{head} {_num(r['p50_us'])} | {_num(r['p99_us'])} | "
                       f"{_num(r['caller_cpu_us'])} | {_num(r.get('replica_cpu_us'))} |")
    return "\n".join(out)


# -- the link's variant: pickle protocol 5, arrays as out-of-band buffers -----------------
# A message: [u64 pickle length][u32 buffer count][u64 length per buffer][pickle][buffers].
# One call at a time, so no call id, kind or token: what it measures is the copies.
OOB_HEAD = struct.Struct("<QI")
OOB_MIN = 1 << 14  # a smaller buffer goes in the pickle stream: a copy costs less than a recv


def oob_parts(value: Any) -> list[Any]:
    """`value` as the pieces of one message; the large buffers are the arrays' own memory."""
    bufs: list[memoryview] = []

    def aside(b: pickle.PickleBuffer) -> bool:
        raw = b.raw()
        if raw.nbytes < OOB_MIN:
            return True  # in the pickle stream
        bufs.append(raw)
        return False

    main = pickle.dumps(value, protocol=5, buffer_callback=aside)
    head = OOB_HEAD.pack(len(main), len(bufs)) + struct.pack(
        f"<{len(bufs)}Q", *(b.nbytes for b in bufs))
    return [head + main, *bufs]


def advance(views: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of `views` once `sent` bytes of them went out."""
    views = list(views)
    while sent:
        if sent >= len(views[0]):
            sent -= len(views.pop(0))
        else:
            views[0], sent = views[0][sent:], 0
    return views


def _views(parts: list[Any]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts]


def _split(head: bytearray, rest: bytearray) -> tuple[memoryview, tuple[int, ...]]:
    _, n_bufs = OOB_HEAD.unpack(head)
    return memoryview(rest)[8 * n_bufs:], struct.unpack_from(f"<{n_bufs}Q", rest)


def _rest_size(head: bytearray) -> int:
    n_main, n_bufs = OOB_HEAD.unpack(head)
    return 8 * n_bufs + n_main


def recv_exactly(sock: socket.socket, n: int) -> bytearray:
    out, have = bytearray(n), 0
    view = memoryview(out)
    while have < n:
        got = sock.recv_into(view[have:])
        if not got:
            raise ConnectionError("the other end closed the connection")
        have += got
    return out


def read_oob(sock: socket.socket) -> Any:
    head = recv_exactly(sock, OOB_HEAD.size)
    main, lens = _split(head, recv_exactly(sock, _rest_size(head)))
    return pickle.loads(main, buffers=[recv_exactly(sock, n) for n in lens])


def send_oob(sock: socket.socket, value: Any) -> None:
    views = _views(oob_parts(value))
    while views:
        views = advance(views, sock.sendmsg(views))


def serve_oob(sock: socket.socket, fn: Callable[..., Any]) -> None:
    """The replica's side, on its own thread: read a call's arguments, answer `fn(*args)`."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            send_oob(sock, fn(*read_oob(sock)))
    except OSError:  # ConnectionError included: the caller went away
        pass
    finally:
        sock.close()


class OobLink:
    """The caller's side, on its event loop: `await call(*args)`, one call at a time."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    @classmethod
    async def open_to(cls, host: str, port: int) -> OobLink:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        return cls(sock)

    async def _recv(self, n: int) -> bytearray:
        loop, out, have = asyncio.get_running_loop(), bytearray(n), 0
        view = memoryview(out)
        while have < n:
            got = await loop.sock_recv_into(self.sock, view[have:])
            if not got:
                raise ConnectionError("the other end closed the connection")
            have += got
        return out

    async def call(self, *args: Any) -> Any:
        views = _views(oob_parts(args))
        try:
            views = advance(views, self.sock.sendmsg(views))
        except BlockingIOError:
            pass
        for v in views:
            await asyncio.get_running_loop().sock_sendall(self.sock, v)
        head = await self._recv(OOB_HEAD.size)
        main, lens = _split(head, await self._recv(_rest_size(head)))
        return pickle.loads(main, buffers=[await self._recv(n) for n in lens])

    def close(self) -> None:
        self.sock.close()


# -- the actors ------------------------------------------------------------------------
@ray.remote
class Replica:
    """Answers a batch with `x * 2`, as a model replica answers one, on every transport."""

    def __init__(self) -> None:
        self.link: Any = None

    def run(self, x: np.ndarray) -> np.ndarray:
        return x * 2

    def cpu_s(self) -> float:
        return time.process_time()  # the whole process's: every thread

    def link_address(self) -> tuple[str, int, bytes]:
        from deployments.replica.link_server import ThreadedLinkServer

        if self.link is None:
            self.link = ThreadedLinkServer(self.run, 1)
        return self.link.address("127.0.0.1")

    def oob_address(self) -> tuple[str, int]:
        listener = socket.create_server(("127.0.0.1", 0))

        def accept_one() -> None:
            sock, _ = listener.accept()
            listener.close()
            serve_oob(sock, self.run)

        threading.Thread(target=accept_one, name="oob-link", daemon=True).start()
        return listener.getsockname()[:2]


@ray.remote
class Caller:
    """An async actor, as the batching actor is: connects one transport and times it."""

    def __init__(self) -> None:
        self.call: Callable[[Any], Any] | None = None
        self.close: Callable[[], Any] = lambda: None

    async def connect(self, transport: str, replica: Any) -> float:
        """Opens the transport to `replica`; the seconds that took (a graph: its compile)."""
        t0 = time.perf_counter()
        await self._open(transport, replica)
        return time.perf_counter() - t0

    async def _open(self, transport: str, replica: Any) -> None:
        if transport == "local":
            async def local(x: np.ndarray) -> np.ndarray:
                return x * 2
            self.call = local
        elif transport == "actor":
            self.call = replica.run.remote
        elif transport == "graph":
            from ray.dag import InputNode

            with InputNode() as inp:
                dag = replica.run.bind(inp)
            graph = dag.experimental_compile(enable_asyncio=True)

            async def by_graph(x: np.ndarray) -> np.ndarray:
                return await (await graph.execute_async(x))
            self.call, self.close = by_graph, graph.teardown
        elif transport == "link":
            from deployments.wire.link import Link

            link = await Link.open_to(*await replica.link_address.remote())
            self.call, self.close = link.call, link.close
        elif transport == "link-oob":
            oob = await OobLink.open_to(*await replica.oob_address.remote())
            self.call, self.close = oob.call, oob.close
        else:
            raise ValueError(f"unknown transport {transport!r}")

    async def measure(self, rows: int, cols: int, calls: int, warmup: int,
                      replica: Any) -> dict[str, Any]:
        x = np.random.default_rng(rows * cols).random((rows, cols), dtype=np.float32)
        want = x * 2
        for i in range(warmup):
            _check(await self.call(x), want, f"warm-up call {i}")
        took = []
        theirs0 = await replica.cpu_s.remote() if replica is not None else 0.0
        own0 = time.process_time()
        for _ in range(calls):
            t0 = time.perf_counter()
            out = await self.call(x)
            took.append(time.perf_counter() - t0)
        own = time.process_time() - own0
        theirs = (await replica.cpu_s.remote() - theirs0) if replica is not None else None
        _check(out, want, "the last timed call")
        return {**summarize(took), "calls": calls, "caller_cpu_us": own / calls * 1e6,
                "replica_cpu_us": None if theirs is None else theirs / calls * 1e6}

    async def shut(self) -> None:
        self.close()


def _check(got: Any, want: np.ndarray, which: str) -> None:
    if not (isinstance(got, np.ndarray) and got.dtype == want.dtype
            and np.array_equal(got, want)):
        raise AssertionError(f"{which} answered {type(got).__name__} "
                             f"{getattr(got, 'shape', '')}, not x * 2")


def _error(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e  # a RayTaskError's own
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1][:300]}"


def run_transport(transport: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every size over one transport, on a fresh caller and replica, both ended after."""
    caller = Caller.remote()
    replica = None if transport == "local" else Replica.remote()
    out = []
    try:
        try:
            connect_ms = ray.get(caller.connect.remote(transport, replica)) * 1e3
        except Exception as e:  # this Ray cannot run it: the error is the result
            return [{"transport": transport, "rows": r, "cols": c, "error": _error(e)}
                    for r, c in SIZES]
        for r, c in SIZES:
            row = {"transport": transport, "rows": r, "cols": c, "connect_ms": connect_ms}
            try:
                row.update(ray.get(caller.measure.remote(
                    r, c, calls_for(args, r, c), args.warmup, replica)))
            except Exception as e:
                row["error"] = _error(e)
            out.append(row)
            print(f"{LABELS[transport]:<46} {size_label(r, c):<20} " + (
                f"failed: {row['error']}" if "error" in row else
                f"p50 {row['p50_us']:8.0f} µs  p99 {row['p99_us']:8.0f} µs  CPU caller "
                f"{row['caller_cpu_us']:6.0f} + replica {_num(row['replica_cpu_us']):>6} "
                f"µs/call"), flush=True)
        ray.get(caller.shut.remote())
    finally:
        for actor in (caller, replica):
            if actor is not None:
                ray.kill(actor)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    rows: list[dict[str, Any]] = []
    try:
        for transport in ("local", *args.transports):
            rows += run_transport(transport, args)
    finally:
        ray.shutdown()
    print()
    print(table(rows))
    print("\nset-up (open the link, compile the graph): " + ", ".join(
        f"{r['transport']} {r['connect_ms']:,.0f} ms" for r in rows
        if r["rows"] == 1 and "connect_ms" in r))
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    save_json(args.json, {
        "benchmark": "benchmarks.serve.channels", "started_utc": started.isoformat(),
        "python": platform.python_version(), "ray": ray.__version__,
        "numpy": np.__version__, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "args": vars(args), "rows": rows})


if __name__ == "__main__":
    # By its own name, so that Ray's workers import the actors rather than unpickle them
    # (run as __main__, they would be pickled by value, with their module's globals).
    from benchmarks.serve.channels import main as by_name

    by_name()
