"""Differential fuzzing of the own HTTP server's framing against h11 (the reference).

Hypothesis (a fixed seed: the same streams every run) builds byte streams of one to
four requests from parts that servers disagree on: versions, targets, Host, Content-
Length and Transfer-Encoding values, chunk sizes and extensions, trailers, obs-fold and
bare LF, control bytes, connection options, bodies too short or too long, and random
corruption. Each stream goes to the server (with an app that echoes what it framed:
method, target, body) and, for reference, through h11 as a server. The server passes
when every request it answered 200 is the one h11 framed at that position (same
method, target, body), it never answers a request h11 did not frame whole, it answers
every request h11 framed unless it refused input before it with a 4xx (stricter than
h11 is allowed), and it never answers 5xx or hangs.

RAYBATCH_FUZZ_STREAMS sets the number of streams (10,000 by default). Hypothesis draws them
in examples of `BATCH`, each stream on a connection of its own, all sent before any answer
is read (the server frames them side by side): its cost per example is shared. No shrinking
(a batch of 25 shrinks slowly): a failure names the one stream that failed, as sent.

Drawing is most of the cost, so the default streams are drawn once and shipped with the
tests (`tests/data/h11-differential-streams.xz`, under a key of the parts and strategies
below, the count, batch and seed): a fresh machine, as CI's always is, reads them instead
of drawing. A change to the parts or strategies makes the shipped file stale: a test says
so and how to draw it again (`python -m tests.unit.deployments.http.test_differential`),
and until then the streams are drawn and kept in the cache (`$RAYBATCH_CACHE_DIR`, else
`$XDG_CACHE_HOME/raybatch`, else `~/.cache/raybatch`) under a key of this file's bytes,
Hypothesis' version, the count and Python's version; so are other counts
(`RAYBATCH_FUZZ_STREAMS`). A damaged file is drawn again (a checksum says). The seed fixes
what Hypothesis draws for a given set of loaded modules (it mixes in constants of the
modules imported when it draws), so the shipped file also keeps the streams the same from
one run and one machine to the next, whatever else the run imported.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import socket
import struct
import sys
import tempfile
from pathlib import Path

import h11
import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.unit.deployments.http.wire import ServerThread, exchange

SHIPPED_STREAMS = 10_000  # the default count, the one shipped with the tests
STREAMS = int(os.environ.get("RAYBATCH_FUZZ_STREAMS", str(SHIPPED_STREAMS)))

METHODS = ([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"],
           [b"get", b"G\x00T", b"", b"G(T"])
TARGETS = ([b"/", b"/a", b"/a/b?c=d&e", b"/%41%zz", b"/a#frag", b"http://h/x?y", b"//x",
            b"/" + b"a" * 300], [b"*", b"/a b", b"/\x01", b"a:1", b""])
VERSIONS = ([b"HTTP/1.1"], [b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"HTTP/1.1 ", b"HTTP/1",
                            b"http/1.1", b""])
LENGTHS = ([b"0", b"3", b"5", b"12", b"005", b" 5", b"5 "],
           [b"-1", b"+5", b"5, 5", b"0x5", b"99999999999999999999", b"", b"abc"])
CODINGS = ([b"chunked", b"Chunked"], [b"gzip, chunked", b"chunked, gzip", b"identity",
                                      b"xchunked", b" chunked", b"", b"chunked;q=1"])
NAMES = ([b"x-a", b"accept", b"x-Long-Name", b"content-type"], [b"x a", b"x\x7fa", b"", b"x:a"])
VALUES = ([b"v", b"", b"  padded  ", b"caf\xe9", b"a\tb", b"x" * 200], [b"a\x00b", b"a\rb"])
EXTRAS = ([b"connection: keep-alive", b"expect: 100-continue", b"connection: close"],
          [b" folded", b"\tfolded", b"no-colon", b"x-a : b", b"host: h2"])


def pick(draw, choices: tuple[list, list], bad_in: int = 12) -> bytes:
    """A good value, or (one time in `bad_in`) a bad one."""
    good, bad = choices
    return draw(st.sampled_from(bad if draw(st.integers(0, bad_in - 1)) == 0 else good))


@st.composite
def header_lines(draw) -> tuple[list[bytes], str, int]:
    """Header lines, and the framing they ask for: ('length', n), ('chunked', 0), ('none', 0)."""
    lines: list[bytes] = [b"host: h"] if draw(st.integers(0, 15)) else []
    framing, n = "none", 0
    kind = draw(st.sampled_from(["none", "length", "length", "chunked", "chunked"] * 4 +
                                ["both", "length2"]))
    if kind in ("length", "both", "length2"):
        value = pick(draw, LENGTHS)
        lines.append(b"content-length: " + value)
        if kind == "length2":
            lines.append(b"content-length: " + pick(draw, LENGTHS, 3))
        stripped = value.strip()
        framing, n = "length", int(stripped) if stripped.isdigit() and len(stripped) < 6 else 0
    if kind in ("chunked", "both"):
        lines.append(b"transfer-encoding: " + pick(draw, CODINGS))
        framing = "chunked"
    for _ in range(draw(st.integers(0, 3))):
        lines.append(pick(draw, NAMES, 20) + b": " + pick(draw, VALUES, 20))
    if draw(st.integers(0, 3)) == 0:
        lines.append(pick(draw, EXTRAS, 4))
    return draw(st.permutations(lines)), framing, n


@st.composite
def message(draw) -> bytes:
    eol = b"\n" if draw(st.integers(0, 30)) == 0 else b"\r\n"
    line = b" ".join([pick(draw, METHODS, 30), pick(draw, TARGETS, 30),
                      pick(draw, VERSIONS, 20)])
    lines, framing, n = draw(header_lines())
    head = eol.join([line, *lines]) + eol + eol
    crlf = [b"\r\n"], [b"", b"\n", b"\r"]
    if framing == "length":
        exact = draw(st.integers(0, 9)) > 0
        body = draw(st.binary(min_size=n if exact else max(0, n - 2),
                              max_size=n if exact else n + 2))
    elif framing == "chunked":
        body = b""
        for _ in range(draw(st.integers(0, 3))):
            chunk = draw(st.binary(min_size=1, max_size=20))
            size = b"%x" % len(chunk)
            size = pick(draw, ([size, size.upper(), size + b";e=1", b"0" + size],
                               [size + b" ", b"z", b"-1", b"f" * 20]), 20)
            body += size + b"\r\n" + chunk + pick(draw, crlf, 30)
        body += b"0\r\n" + pick(draw, ([b"", b"x-t: 1\r\n"],
                                        [b"content-length: 3\r\n", b"bad trailer\r\n"]), 8)
        body += pick(draw, crlf, 30)
    else:
        body = b"stray" if draw(st.integers(0, 20)) == 0 else b""
    return head + body


@st.composite
def stream(draw) -> bytes:
    data = draw(st.sampled_from([b"", b"", b"", b"\r\n"])) + b"".join(
        draw(st.lists(message(), min_size=1, max_size=4)))
    if draw(st.integers(0, 9)) == 0:  # random corruption
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 3))):
            if data:
                i = draw(st.integers(0, len(data) - 1))
                data[i] = draw(st.integers(0, 255))
        data = bytes(data)
    return data


def h11_frames(data: bytes) -> list[tuple[str, str, int, str]]:
    """What h11, as a server, frames of `data`: (method, target, body length, sha1).

    Two leniencies of llhttp that RFC 9112 allows a server are applied first, so each
    request is read by a fresh h11 connection from the bytes the last one left: CR and LF
    before a request line are dropped (2.2 asks a server to ignore at least one empty line
    there; h11 ignores none), and runs of spaces between the request line's parts count as
    one (3: a recipient may split the line on whitespace; h11 wants one space). An HTTP/1.0
    request with `Connection: keep-alive` (or `Proxy-Connection`) keeps the connection, as
    the server allows and h11 does not."""
    out: list[tuple[str, str, int, str]] = []
    rest = data
    while True:
        rest = rest.lstrip(b"\r\n")
        if not rest:
            return out
        end = rest.find(b"\n")
        line, tail = (rest, b"") if end < 0 else (rest[:end], rest[end:])
        rest = re.sub(rb"(?<=\S) {2,}(?=\S)", b" ", line) + tail
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(rest)
        conn.receive_data(b"")
        current, body = None, b""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return out
            if isinstance(event, h11.Request):
                current, body = (event.method.decode(), _normal(event.target)), b""
                # HTTP/1.0 keep-alive, which the server serves and h11 does not
                # (llhttp reads Proxy-Connection as Connection)
                kept_10 = event.http_version == b"1.0" and any(
                    n in (b"connection", b"proxy-connection") and b"keep-alive" in v.lower()
                    for n, v in event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append((*current, len(body), hashlib.sha1(body).hexdigest()))
                if conn.their_state is h11.MUST_CLOSE and not kept_10:
                    return out  # the request asked to close: nothing after it is read
                rest = conn.trailing_data[0]
                break
            else:  # NEED_DATA, PAUSED, ConnectionClosed: no whole request more
                return out


def _normal(target: bytes) -> str:
    """A target as the server's app sees it: origin-form, no fragment."""
    if target.lower().startswith((b"http://", b"https://")):
        rest = target.split(b"//", 1)[1]
        target = b"/" + rest.split(b"/", 1)[1] if b"/" in rest else b"/"
    return target.split(b"#", 1)[0].decode("latin-1")


@pytest.fixture(scope="module")
def echo_server():
    with ServerThread("echo", header_timeout_s=5.0) as server:
        yield server


def test_the_reference_frames_what_it_should():
    """The oracle itself: h11 frames two pipelined requests, a chunked body, and stops
    at garbage."""
    two = b"GET /a HTTP/1.1\r\nhost: h\r\n\r\nPOST /b HTTP/1.1\r\nhost: h\r\ncontent-length: 2" \
          b"\r\n\r\nhi"
    assert [f[:3] for f in h11_frames(two)] == [("GET", "/a", 0), ("POST", "/b", 2)]
    chunked = b"POST /c HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0" \
              b"\r\n\r\n\x00garbage\r\n\r\n"
    assert [f[:3] for f in h11_frames(chunked)] == [("POST", "/c", 2)]
    close = b"GET /a HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n" \
            b"GET /b HTTP/1.1\r\nhost: h\r\n\r\n"
    assert [f[:2] for f in h11_frames(close)] == [("GET", "/a")]
    blank = b"\r\rGET /a HTTP/1.1\r\nhost: h\r\n\r\n\r\nGET /b HTTP/1.1\r\nhost: h\r\n\r\n"
    assert [f[:2] for f in h11_frames(blank)] == [("GET", "/a"), ("GET", "/b")]
    kept = b"GET /a HTTP/1.0\r\nconnection: keep-alive\r\n\r\n" \
           b"GET /b HTTP/1.0\r\n\r\nGET /c HTTP/1.0\r\n\r\n"
    assert [f[:2] for f in h11_frames(kept)] == [("GET", "/a"), ("GET", "/b")]
    spaced = b"DELETE  /x?y HTTP/1.1\r\nhost: h\r\n\r\n"
    assert [f[:2] for f in h11_frames(spaced)] == [("DELETE", "/x?y")]


BATCH = 25  # streams per example, sent on as many connections at once
SEED = 20_261_126  # the same streams every run, whatever else in this file changes


def draw_batches() -> list[list[bytes]]:
    """What Hypothesis draws (seed SEED, generation only, `STREAMS // BATCH` examples of
    `BATCH` streams): each example's batch, in order."""
    batches: list[list[bytes]] = []

    @seed(SEED)
    @settings(max_examples=max(1, STREAMS // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(batch=st.lists(stream(), min_size=BATCH, max_size=BATCH))
    def draw(batch: list[bytes]) -> None:
        batches.append(batch)

    draw()
    return batches


CACHE_MAGIC = b"raybatch h11 differential streams 1\n"


def _cache_path() -> Path:
    explicit = os.environ.get("RAYBATCH_CACHE_DIR")
    base = Path(explicit) if explicit else Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raybatch"
    key = hashlib.sha256(b"\0".join([
        Path(__file__).read_bytes(), hypothesis.__version__.encode(),
        b"%d %d %d" % (STREAMS, BATCH, SEED), b"%d.%d" % sys.version_info[:2]])).hexdigest()
    return base / f"h11-differential-{key[:24]}.bin"


def _encode(batches: list[list[bytes]]) -> bytes:
    parts = [struct.pack("<I", len(batches))]
    for batch in batches:
        parts.append(struct.pack("<I", len(batch)))
        for data in batch:
            parts += [struct.pack("<I", len(data)), data]
    body = b"".join(parts)
    return CACHE_MAGIC + hashlib.sha256(body).digest() + body


def _decode(blob: bytes) -> list[list[bytes]]:
    """The batches `_encode` wrote; ValueError if `blob` is not such a file, whole."""
    head = len(CACHE_MAGIC)
    body = blob[head + 32:]
    if blob[:head] != CACHE_MAGIC or hashlib.sha256(body).digest() != blob[head:head + 32]:
        raise ValueError("not a whole cache file")
    pos, batches = 4, []
    for _ in range(struct.unpack_from("<I", body)[0]):
        (n,), pos = struct.unpack_from("<I", body, pos), pos + 4
        batch = []
        for _ in range(n):
            (size,), pos = struct.unpack_from("<I", body, pos), pos + 4
            batch.append(body[pos:pos + size])
            pos += size
        batches.append(batch)
    if pos != len(body):
        raise ValueError("trailing bytes")
    return batches


SHIPPED = Path(__file__).resolve().parents[3] / "data" / "h11-differential-streams.xz"


def _strategies_key() -> bytes:
    """What decides the streams: the source of the parts and strategies above (from METHODS
    to the reference framer), the count, batch and seed."""
    source = Path(__file__).read_bytes().split(b"\nMETHODS = ", 1)[1]
    return hashlib.sha256(b"\0".join([source.split(b"\ndef h11_frames(", 1)[0],
                                      b"%d %d %d" % (STREAMS, BATCH, SEED)])).digest()


def _shipped() -> tuple[bytes, list[list[bytes]]]:
    """The shipped file's key and batches; OSError or ValueError if it is missing or damaged."""
    try:
        blob = lzma.decompress(SHIPPED.read_bytes())
    except lzma.LZMAError as e:
        raise ValueError(f"{SHIPPED} is not an xz file: {e}") from e
    return blob[:32], _decode(blob[32:])


def write_shipped() -> Path:
    """Draw the default streams and write them where the tests look first."""
    if STREAMS != SHIPPED_STREAMS:
        raise SystemExit(f"RAYBATCH_FUZZ_STREAMS is {STREAMS}: the shipped file holds the "
                         f"default {SHIPPED_STREAMS}; unset it to draw that file again")
    SHIPPED.write_bytes(lzma.compress(_strategies_key() + _encode(draw_batches()),
                                      preset=9 | lzma.PRESET_EXTREME))
    return SHIPPED


def drawn_batches() -> list[list[bytes]]:
    """`draw_batches()`: the shipped streams when they are these strategies' (else from the
    cache when it holds them for this file, else drawn, and stored for the next run: written
    to a temporary name, then renamed)."""
    if STREAMS == SHIPPED_STREAMS:  # the shipped file holds only the default count
        try:
            key, batches = _shipped()
            if key == _strategies_key():
                return batches
        except (OSError, ValueError, struct.error):
            pass  # missing or damaged: the test that checks it says so
    path = _cache_path()
    try:
        return _decode(path.read_bytes())
    except (OSError, ValueError, struct.error):
        pass  # not cached yet (or damaged): draw
    batches = draw_batches()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(_encode(batches))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of the dir
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: drawn each run, as before
    return batches


def test_the_stream_cache_gives_back_what_was_drawn(tmp_path, monkeypatch):
    """The cache's format round-trips, a damaged file is drawn again, and what comes back is
    what Hypothesis draws for the seed (a few examples' worth)."""
    monkeypatch.setattr(sys.modules[__name__], "STREAMS", 3 * BATCH)  # not the shipped key
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path))
    drawn = draw_batches()
    assert len(drawn) == 3 and all(len(b) == BATCH for b in drawn)
    assert drawn_batches() == drawn  # drawn and stored
    assert drawn_batches() == drawn  # read back
    (path,) = tmp_path.iterdir()
    blob = path.read_bytes()
    assert _decode(blob) == drawn
    path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))  # damaged: drawn again, rewritten
    assert drawn_batches() == drawn and path.read_bytes() == blob


def test_the_shipped_streams_are_these_strategies_own():
    """The shipped file is whole and was drawn by the parts and strategies above: else a
    fresh machine draws for a minute each run (and the streams depend on what it imported)."""
    key, batches = _shipped()
    assert sum(map(len, batches)) == SHIPPED_STREAMS and all(len(b) == BATCH for b in batches)
    assert key == _strategies_key() or STREAMS != SHIPPED_STREAMS, (
        f"{SHIPPED} was drawn by other parts or strategies than this file's: draw it again "
        "with `.venv/bin/python -m tests.unit.deployments.http.test_differential` and commit it")


def test_the_shipped_file_is_read_without_drawing(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "draw_batches", lambda: pytest.fail("drew"))
    if STREAMS == SHIPPED_STREAMS:
        assert drawn_batches() == _shipped()[1]


@pytest.fixture(scope="module")
def batches() -> list[list[bytes]]:
    return drawn_batches()


def test_the_server_frames_as_h11_does_or_is_stricter(echo_server, batches):
    assert sum(map(len, batches)) == max(1, STREAMS // BATCH) * BATCH
    for batch in batches:
        frame_batch(echo_server, batch)


def frame_batch(echo_server, batch: list[bytes]) -> None:
    socks = [socket.create_connection(("127.0.0.1", echo_server.port), timeout=8)
             for _ in batch]
    try:
        for sock, data in zip(socks, batch):  # all sent first: the server frames them at once
            send_all(sock, data)
        for sock, data in zip(socks, batch):
            check(data, exchange(sock, [], half_close=False, timeout_s=8))
    finally:
        for sock in socks:
            sock.close()


def send_all(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server refused and closed early: its answer is still read


def check(data: bytes, got) -> None:
    """The server's answers to `data` against what h11 frames of it."""
    reference = h11_frames(data)
    finals = [r for r in got.responses if r.status >= 200]
    assert got.closed or got.reset, f"no close after the stream: {data!r}"
    assert all(r.status < 500 for r in finals), (data, [r.status for r in finals])
    ok = [r for r in finals if r.status == 200]
    assert [r.status for r in finals[:len(ok)]] == [200] * len(ok), \
        (data, [r.status for r in finals])  # a refusal ends the connection
    framed = [(e["method"], e["target"], e["length"], e["sha"]) for e in (r.json() for r in ok)]
    assert framed == reference[:len(framed)], (data, framed, reference)
    refused = len(finals) > len(ok)
    assert len(framed) == len(reference) or refused, \
        f"answered {len(framed)} of the {len(reference)} requests h11 frames, refused none: " \
        f"{data!r}"


if __name__ == "__main__":
    print(f"wrote {write_shipped()}")
