"""A refusal raised while the parser reads a head (431, 414, 417, 400 for a bad Host...) is
answered with its own status, whatever else is going on when the head is parsed.

httptools hands a callback's exception over as the parser error's context; a feed made
inside an exception handler (the app answered the previous request's error, and the next
request's bytes were parsed from there) had that handled exception in its place, and the
refusal came out as 400 "User callback error" (found by the front's differential fuzzer
beside a CPU hog: `GET /nope`, 404, then a head with `Expect: nothing`)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.unit.deployments.http.wire import ServerThread, parse_responses

CASES = [
    (b"POST /v2/models/square/infer HTTP/1.1\r\nhost: h\r\nexpect: nothing\r\n"
     b"content-length: 2\r\n\r\n{}", 417),
    (b"POST /v2/models/square/infer HTTP/1.1\r\nhost: h\r\nhost: i\r\n\r\n", 400),
    (b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nhost: h\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nhost: h\r\nx-big: " + b"b" * 2000 + b"\r\n\r\n", 431),
]


@pytest.mark.parametrize("raw,status", CASES, ids=["417", "400", "414", "431"])
def test_a_head_refused_while_another_error_is_handled_keeps_its_status(raw, status):
    with ServerThread(front=False, max_header_bytes=1024) as s:
        sock = s.connect()
        wait_until(lambda: s.call(lambda: bool(s.server.connections)), 30, 0.01, "accepted")

        def feed_inside_a_handler() -> None:
            conn = next(iter(s.server.connections))
            try:
                raise LookupError("the previous request's error, being answered")
            except LookupError:
                conn.data_received(raw)

        s.call(feed_inside_a_handler)
        sock.settimeout(30)
        data = b""
        while not parse_responses(data)[0] and (chunk := sock.recv(65536)):
            data += chunk
        sock.close()
        (answer, *_), _ = parse_responses(data)
        assert answer.status == status, answer
        assert b"User callback error" not in answer.body
