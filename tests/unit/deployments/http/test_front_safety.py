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
- accept failing with EMFILE and a reset on a connection whose input buffer was full each
  kept the front's thread spinning.
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
import time
from pathlib import Path

import pytest

from deployments.http import front as front_module
from deployments.http.front import available
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
        wait_until(lambda: stats(s)["plans"] > plans, 10, 0.01, "the plan learnt")


def stats(s: ServerThread) -> dict:
    return s.call(s.server.stats)


def reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client that crashed or was killed."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_one(sock: socket.socket, timeout_s: float = 10.0):
    sock.settimeout(timeout_s)
    data = b""
    while True:
        got, _ = parse_responses(data)
        if got:
            return got[0]
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk


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
    rows, never the first client's."""
    monkeypatch.setattr(front_module, "_front", _narrow_front(tmp_path))
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()  # the model holds every batch until the test lets it go
        gone = s.connect()
        gone.sendall(binary([7777.0, 8.0]))
        wait_until(lambda: stats(s)["queued"] == 1, 10, 0.01, "the request queued")
        reset(gone)
        wait_until(lambda: stats(s)["connections"] == 0, 10, 0.01, "the reset seen")
        for _ in range(7):  # the slot's generation moves 8 times: 0 mod 4
            c = s.connect()
            wait_until(lambda: stats(s)["connections"] == 1, 10, 0.005, "accepted")
            c.close()
            wait_until(lambda: stats(s)["connections"] == 0, 10, 0.005, "closed")
        mine = s.connect()
        mine.sendall(binary([1.0, 2.0]))
        wait_until(lambda: stats(s)["queued"] == 1, 10, 0.01, "the second request queued")
        assert stats(s)["reserved"] == 1  # the first client's slot waits for its answer
        s.backend.step.set()
        answer = read_one(mine)
        assert answer.status == 200 and squares(answer.body, 2) == (1.0, 4.0)
        wait_until(lambda: stats(s)["reserved"] == 0, 10, 0.01, "the slot freed")
        mine.close()


def _churn(port: int, n: int) -> None:
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            reset(c)
        else:
            c.close()


def test_answers_keep_their_owners_through_100k_connections():
    """100,000 connections open and close (half of them reset) while queued requests of
    clients that went away wait for the model, and clients between them check that each
    answer they read is their own. 65,535 connections after a client left, a slot's 16-bit
    generation comes round to its value."""
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()
        for v in range(3):
            gone = s.connect()
            gone.sendall(binary([1000.0 + v, 8.0]))
            wait_until(lambda: stats(s)["queued"] == 1, 10, 0.01, "the request queued")
            reset(gone)
            wait_until(lambda: stats(s)["connections"] == 0, 10, 0.01, "the reset seen")
        waiting = []
        for k, churn in enumerate([65_535, 1, 1, 34_458]):
            _churn(s.port, churn)
            c = s.connect()
            c.sendall(binary([float(k), 3.0]))
            waiting.append((k, c))
        wait_until(lambda: stats(s)["queued"] == len(waiting), 20, 0.01, "queued")
        s.backend.step.set()
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


# -- resource faults -----------------------------------------------------------------------
def test_a_reset_on_a_connection_with_a_full_input_buffer_is_closed():
    """A client pipelines requests until the front stops reading it (its queue and input
    buffer full, the model holding every batch), then resets: the connection is closed at
    once, not when the model answers, and its slot is freed once it does."""
    with ServerThread(front=True) as s:
        learn(s)
        s.backend.step.clear()
        c = s.connect()
        c.setblocking(False)
        block = binary([2.0, 3.0]) * 256
        pushed, stalled = 0, 0
        while stalled < 50:  # 0.5 s without the front taking a byte: it stopped reading
            try:
                pushed += c.send(block)
                stalled = 0
            except BlockingIOError:
                stalled += 1
                time.sleep(0.01)
        held = stats(s)
        assert held["queued"] == s.server.max_pipelined and held["unparsed_bytes"] > 0, held
        reset(c)
        wait_until(lambda: stats(s)["connections"] == 0, 10, 0.01, "the reset collected")
        loops = stats(s)["loops"]
        time.sleep(0.5)
        assert stats(s)["loops"] - loops < 100, "the front's thread spins"
        assert stats(s)["reserved"] == 1
        s.backend.step.set()
        wait_until(lambda: stats(s)["reserved"] == 0, 10, 0.01, "the slot freed")


CHILD = """
import asyncio, json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from deployments.http.front import FrontServer
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
        before = ask("stats")
        time.sleep(1.0)
        after = ask("stats")
        assert after["loops"] - before["loops"] < 100, (before, after)
        assert after["refused"] >= 1 or got == b"", after
    finally:
        for c in conns:
            c.close()
        child.kill()
        child.wait(10)
        err = child.stderr.read()
    assert "RLIMIT_NOFILE" in err, err
