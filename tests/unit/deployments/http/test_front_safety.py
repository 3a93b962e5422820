"""The native front's safety, over real sockets: an answer never reaches another client,
a byte stream is framed as the Python server frames it, and running out of descriptors or
meeting a reset costs no spinning thread.

Each case here was a defect of the front (each test failed before its fix):
- a queued request's answer reached the next connection on its slot once the slot's
  generation came round again (`test_an_answer_never_reaches_the_next_client_on_its_slot`
  builds the front with a 2-bit generation so it comes round in four connections);
- the Python server's parser had taken the first bytes of the next request when it handed
  a connection back, and they were lost (an honest client got 400; a cut head let its body
  be served as a request of its own);
- `Proxy-Connection: close`, trailing blanks in header values and an escaped duplicate
  JSON key were read one way by the front and another by the Python server;
- accept failing with EMFILE and a reset on a connection the front had stopped reading
  each kept the front's thread spinning;
- a client that went away left its queued requests to run in the engine (now cancelled
  there, or dropped while they gather).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deployments.http.native import front as front_module
from deployments.http.native.blocks import Blocks
from deployments.http.native.front import available
from tests.conftest import wait_until
from tests.unit.deployments.http.wire import ServerThread, exchange, parse_responses, request

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

SQUARE = "/v2/models/square/infer"
HERE = Path(front_module.__file__).parent
ROOT = Path(__file__).resolve().parents[4]


def binary(values: list[float], path: str = SQUARE, **headers: str) -> bytes:
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                     "shape": [len(values)],
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return request("POST", path, header + data,
                   inference_header_content_length=str(len(header)), **headers)


def squares(body: bytes, n: int) -> tuple[float, ...]:
    return struct.unpack(f"<{n}f", body[-4 * n:])


def learn(s: ServerThread, raw: bytes | None = None, plan: bool = True) -> None:
    """One request answered by the Python server: the front learns its plan (`plan`)."""
    plans = stats(s).get("plans", 0) if s.front else 0
    got = exchange(s.port, raw or binary([1.0, 1.0]), count=1)
    assert got.statuses == [200], got
    if s.front and plan:  # the plan is learnt just after the answer is written
        wait_until(lambda: stats(s)["plans"] > plans, 60, 0.01, "the plan learnt")


def stats(s: ServerThread) -> dict:
    return s.call(s.server.stats)


def reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client that crashed or was killed."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_n(sock: socket.socket, n: int, timeout_s: float = 30.0) -> list:
    """The next `n` responses on `sock` (nothing else may follow them yet)."""
    sock.settimeout(timeout_s)
    data = b""
    while True:
        got, _ = parse_responses(data)
        if len(got) >= n:
            assert len(got) == n, got
            return got
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk


def read_one(sock: socket.socket):
    return read_n(sock, 1)[0]


def assert_rests(read_stats) -> None:
    """The front's thread is at rest: over five of its 100 ms waits that ended with
    nothing to do, it went round a handful of times, not thousands (a thread spinning on a
    ready descriptor never has such a wait). Counts, not time."""
    first = read_stats()
    last = wait_until(lambda: (now := read_stats())["idle_loops"] >= first["idle_loops"] + 5
                      and now, 30, 0.05, "the front's thread to rest (it spins)")
    assert last["loops"] - first["loops"] < 5 + 50, (first, last)


# -- an answer is its own client's ---------------------------------------------------------
def _narrow_front(tmp: Path):
    """The front built with a 2-bit generation in its tokens (FRONT_TOKEN_GEN_BITS)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the front with a narrow generation")
    out = tmp / f"_front{sysconfig.get_config_var('EXT_SUFFIX')}"
    sources = [HERE / "_front.c", *(HERE / "llhttp" / f"{n}.c" for n in ("api", "http", "llhttp"))]
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-DFRONT_TOKEN_GEN_BITS=2",
                    f"-I{sysconfig.get_paths()['include']}", f"-I{HERE / 'llhttp'}",
                    *map(str, sources), "-o", str(out)], check=True)
    spec = importlib.util.spec_from_file_location("_front", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_answer_never_reaches_the_next_client_on_its_slot(tmp_path, monkeypatch):
    """A client queues a request and resets; connections come and go on its slot until the
    (2-bit) generation comes round; the next client's request is answered with its own
    rows, never the first client's. (The front is told of no client that went away, so the
    gone client's request stays queued: its answer comes, to be dropped.)"""
    monkeypatch.setattr(front_module, "_front", _narrow_front(tmp_path))
    monkeypatch.setattr(Blocks, "gone", lambda self, prefix: None)
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()  # the model holds every batch until the test lets it go
        gone = s.connect()
        gone.sendall(binary([7777.0, 8.0]))
        wait_until(lambda: stats(s)["queued"] == 1, 60, 0.01, "the request queued")
        reset(gone)
        wait_until(lambda: stats(s)["connections"] == 0, 60, 0.01, "the reset seen")
        for _ in range(7):  # the slot's generation moves 8 times: 0 mod 4
            c = s.connect()
            wait_until(lambda: stats(s)["connections"] == 1, 60, 0.005, "accepted")
            c.close()
            wait_until(lambda: stats(s)["connections"] == 0, 60, 0.005, "closed")
        mine = s.connect()
        mine.sendall(binary([1.0, 2.0]))
        wait_until(lambda: stats(s)["queued"] == 1, 60, 0.01, "the second request queued")
        assert stats(s)["reserved"] == 1  # the first client's slot waits for its answer
        s.call(s.backend.step.set)  # on the server's loop: asyncio is not thread-safe
        answer = read_one(mine)
        assert answer.status == 200 and squares(answer.body, 2) == (1.0, 4.0)
        wait_until(lambda: stats(s)["reserved"] == 0, 60, 0.01, "the slot freed")
        mine.close()


def _churn(port: int, n: int) -> None:
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            reset(c)
        else:
            c.close()


def test_answers_keep_their_owners_through_100k_connections(monkeypatch):
    """100,000 connections open and close (half of them reset) while queued requests of
    clients that went away wait for the model, and clients between them check that each
    answer they read is their own. 65,535 connections after a client left, a slot's 16-bit
    generation comes round to its value. (The front is told of no client that went away, so
    their requests stay queued and run, their answers due to slots that no longer hold
    their connections: the case the slot reservation exists for.)"""
    monkeypatch.setattr(Blocks, "gone", lambda self, prefix: None)
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()
        for v in range(3):
            gone = s.connect()
            gone.sendall(binary([1000.0 + v, 8.0]))
            wait_until(lambda: stats(s)["queued"] == 1, 60, 0.01, "the request queued")
            reset(gone)
            wait_until(lambda: stats(s)["connections"] == 0, 60, 0.01, "the reset seen")
        waiting = []
        for k, churn in enumerate([65_535, 1, 1, 34_458]):
            _churn(s.port, churn)
            c = s.connect()
            c.sendall(binary([float(k), 3.0]))
            waiting.append((k, c))
        wait_until(lambda: stats(s)["queued"] == len(waiting), 20, 0.01, "queued")
        s.call(s.backend.step.set)  # on the server's loop: asyncio is not thread-safe
        for k, c in waiting:
            answer = read_one(c)
            assert answer.status == 200 and squares(answer.body, 2) == (k * k, 9.0), k
            c.sendall(binary([float(k), 5.0]))  # and the connection goes on
            assert squares(read_one(c).body, 2) == (k * k, 25.0)
            c.close()
        wait_until(lambda: stats(s)["reserved"] == 0 and stats(s)["connections"] == 0, 20,
                   0.05, "every slot free")
        assert stats(s)["accepted"] >= 100_000


# -- one framing ---------------------------------------------------------------------------
def both(pieces: list[bytes], first: bytes | None = None, gap_s: float = 0.2,
         plan: bool = True, **limits):
    """`pieces` (sent `gap_s` apart, on one connection) to the Python server alone and to
    the front, each having answered `first` (default: a binary infer) on a connection
    before: their exchanges, to compare."""
    out = []
    for front in (False, True):
        with ServerThread(front=front, limits=limits,
                          **({"max_header_bytes": limits["max_header_bytes"]}
                             if "max_header_bytes" in limits else {})) as s:
            learn(s, first, plan)
            got = exchange(s.port, pieces, gap_s=gap_s, timeout_s=5.0)
            out.append(([(r.status, r.body) for r in got.responses], got.closed, got.rest))
            if front:
                fast = stats(s)["fast"]
    return out[0], out[1], fast


def test_bytes_of_the_next_request_taken_before_a_hand_back_are_not_lost():
    """A GET (the Python server's) and an infer pipelined, the segment ending one byte into
    the infer: both answered, as the Python server answers them."""
    infer = binary([2.0, 3.0])
    get = request("GET", "/v2/health/live")
    python, front, _ = both([get + infer[:1], infer[1:]])
    assert [status for status, _ in python[0]] == [200, 200]
    assert front == python


def test_a_cut_head_is_never_served_as_a_request_of_its_own():
    """The head of an /echo request cut after its Content-Length; its body is a whole
    /square request. Served as the Python server frames it: one /echo request."""
    inner = binary([6.0, 7.0])
    outer = (b"POST /v2/models/echo/infer HTTP/1.1\r\nhost: x\r\n"
             b"content-length: %d\r\n" % len(inner))
    get = request("GET", "/v2/health/live")
    python, front, _ = both([get + outer, b"\r\n" + inner])
    assert len(python[0]) == 2 and python[0][1][0] == 400  # /echo refuses that body
    assert front == python


def test_proxy_connection_close_closes_as_the_python_server_reads_it():
    python, front, _ = both([binary([2.0, 3.0], proxy_connection="close")
                                + binary([4.0, 5.0])])
    assert len(python[0]) == 1 and python[1]  # one answer, then the close
    assert front == python


def test_header_bytes_are_counted_as_the_python_server_counts_them():
    """Trailing blanks in a header value count toward max_header_bytes (llhttp hands them
    to the server): over the limit, 431 from both."""
    def counted(raw: bytes) -> int:
        lines = raw.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
        return sum(len(name) + len(value.strip()) for name, value in
                   (line.split(b":", 1) for line in lines))
    fill = 1000 - counted(binary([2.0, 3.0])) - len("x-pad")
    raw = binary([2.0, 3.0], x_pad="a" * fill + " " * 60)
    assert counted(raw) == 1000  # under the limit without the blanks, over it with them
    python, front, _ = both([raw], max_header_bytes=1024)
    assert [status for status, _ in python[0]] == [431]
    assert front == python


def test_an_escaped_duplicate_data_key_is_read_as_orjson_reads_it():
    """`"d\\u0061ta"` is `"data"` decoded: the last one wins for orjson, so the answer
    squares it, whether the front or the Python server reads the body."""
    def body(first: list[int]) -> bytes:
        doc = ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":'
               + json.dumps(first) + ',"d\\u0061ta":[3,4]}]}')
        return request("POST", SQUARE, doc.encode())
    # (the front learns no plan from such a body: each is the Python server's)
    python, front, _ = both([body([5, 6]), body([7, 8])], first=body([1, 2]), plan=False)
    assert [json.loads(b)["outputs"][0]["data"] for _, b in python[0]] == [[9.0, 16.0]] * 2
    assert front == python


def test_the_front_still_serves_what_it_frames():
    """The same framing still queues the plain request: each of these is the front's."""
    with ServerThread(front=True) as s:
        learn(s)
        c = s.connect()
        for i in range(20):
            c.sendall(binary([float(i), 1.0]))
            answer = read_one(c)
            assert answer.status == 200 and squares(answer.body, 2) == (i * i, 1.0)
        c.close()
        assert stats(s)["fast"] == 20


# -- clients that went away ----------------------------------------------------------------
def test_a_block_whose_client_went_away_is_cancelled_in_the_engine():
    """A client's request is in the engine (the model holds it); the client resets: the
    engine request is cancelled (counted 499), and its slot is freed."""
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()
        c = s.connect()
        c.sendall(binary([4242.0, 1.0]))
        wait_until(lambda: s.call(lambda: s.server.book.pending) == 1, 60, 0.01, "submitted")
        reset(c)
        wait_until(lambda: s.backend.cancelled == 1, 60, 0.01, "the engine request cancelled")
        wait_until(lambda: stats(s)["reserved"] == 0, 60, 0.01, "the slot freed")
        s.call(s.backend.step.set)  # on the server's loop: asyncio is not thread-safe
        assert s.app.response_counts().get(("/v2/models/{model}/infer", 499)) == 1
        learn(s, plan=False)  # and it serves on


def test_a_gathering_request_whose_client_went_away_never_reaches_the_model():
    """With a full batch in flight, a request waits to fill a block; its client resets:
    it is dropped there, and the model never sees its rows."""
    with ServerThread(front=True) as s:
        s.backend.gather_s = lambda model: 30.0 if model.name == "square" else 0.0
        learn(s)
        seen: list[float] = []
        submit = s.app._submit

        def logged(model, request, received_s=None, requests=1):
            seen.extend(request.inputs["INPUT0"].ravel().tolist())
            return submit(model, request, received_s, requests)

        s.app._submit = logged
        s.backend.step.clear()
        g = s.server.book.gathers["square"]
        fillers = [s.connect() for _ in range(4)]
        for i, c in enumerate(fillers):  # 64 requests: past a full batch of `square` in flight
            c.sendall(b"".join(binary([float(i), float(j)]) for j in range(16)))
        # each filler request submitted or gathering (how many of each: when they came)
        wait_until(lambda: s.call(lambda: g.holds() and len(seen) // 2 + g.waiting == 64),
                   60, 0.01, "a full batch in flight, the rest gathering")
        held = s.call(lambda: g.waiting)
        gone = s.connect()
        gone.sendall(binary([4242.0, 1.0]))
        wait_until(lambda: s.call(lambda: g.waiting) == held + 1, 60, 0.01,
                   "the request gathering")
        reset(gone)
        wait_until(lambda: s.call(lambda: g.waiting) == held, 60, 0.01, "the request dropped")
        s.call(s.backend.step.set)  # on the server's loop: asyncio is not thread-safe
        for c in fillers:
            got = read_n(c, 16)
            assert all(a.status == 200 for a in got)
            c.close()
        wait_until(lambda: stats(s)["reserved"] == 0, 60, 0.01, "the slot freed")
        assert 4242.0 not in seen


# -- resource faults -----------------------------------------------------------------------
def test_a_reset_on_a_connection_the_front_stopped_reading_is_closed():
    """A client pipelines requests until the front stops reading it (its queue full and
    input waiting, the model holding every batch), then resets: the connection is closed at
    once, not when the model answers; its requests are cancelled in the engine and its
    slot freed."""
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()
        c = s.connect()
        c.setblocking(False)
        block = binary([2.0, 3.0]) * 256

        def push() -> bool:  # until the front stops reading: its queue full, input waiting
            try:
                c.send(block)
            except BlockingIOError:
                pass  # the socket's buffers are full
            held = stats(s)
            return held["queued"] == s.server.max_pipelined and held["unparsed_bytes"] > 0

        wait_until(push, 30, 0.01, "the front's queue full with input waiting")
        reset(c)
        wait_until(lambda: stats(s)["connections"] == 0, 60, 0.01, "the reset collected")
        assert_rests(lambda: stats(s))
        wait_until(lambda: stats(s)["reserved"] == 0, 60, 0.01, "the slot freed")
        assert s.backend.cancelled >= 1
        s.call(s.backend.step.set)  # on the server's loop: asyncio is not thread-safe


CHILD = """
import asyncio, json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from deployments.http.native.front import FrontServer
from tests.unit.deployments.http.fakes import make_app

async def main():
    app, _ = make_app()
    server = FrontServer(app, port=0, reuse_port=False)
    await server.start()
    print(json.dumps({"port": server.port, "max": server.max_connections}), flush=True)
    loop = asyncio.get_running_loop()
    held = []
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() == "fill":  # every descriptor left taken by something else
            try:
                while True:
                    held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            print(json.dumps(len(held)), flush=True)
        elif line.strip() == "stats":
            print(json.dumps(server.stats()), flush=True)
        else:
            return

asyncio.run(main())
"""


def test_at_the_descriptor_limit_clients_are_answered_and_the_thread_rests():
    """RLIMIT_NOFILE 256: max_connections is capped below it (and the log says so); 400
    idle connections are held to the cap; with every descriptor then taken, a new client
    gets a 503 (or a close) at once, and the idle front's thread does not spin."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    conns: list[socket.socket] = []
    try:
        started = json.loads(child.stdout.readline())
        port = started["port"]
        assert started["max"] < 256

        def ask(what: str):
            child.stdin.write(what + "\n")
            child.stdin.flush()
            return json.loads(child.stdout.readline())

        for _ in range(400):
            conns.append(socket.create_connection(("127.0.0.1", port)))
        wait_until(lambda: ask("stats")["accepted"] >= 400, 20, 0.05, "400 accepted")
        assert ask("stats")["connections"] <= started["max"]
        assert ask("fill") > 0
        late = socket.create_connection(("127.0.0.1", port))
        late.settimeout(10)
        got = late.recv(4096)
        assert got == b"" or got.startswith(b"HTTP/1.1 503"), got
        late.close()
        assert_rests(lambda: ask("stats"))
        assert ask("stats")["refused"] >= 1 or got == b""
    finally:
        for c in conns:
            c.close()
        child.kill()
        child.wait(10)
        err = child.stderr.read()
    assert "RLIMIT_NOFILE" in err, err
