"""What a request head says about its framing, checked as RFC 9112 asks of a server.

The parser (llhttp, strict) reads the bytes; these checks refuse what it lets through but a
server must not serve: another HTTP version, a missing or doubled Host in HTTP/1.1, a
Transfer-Encoding that is not exactly `chunked` or comes in HTTP/1.0 (RFC 9112 6.1), an
expectation other than 100-continue (417), and CONNECT (405: this is no proxy). Where the
RFC suggests a 5xx (505, 501), the client gets 400: the fault is in its request, and a
5xx would count against the server in every dashboard.
"""

from __future__ import annotations


class Refused(Exception):
    """A request the server answers with `status` and closes after."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# Input refused as it is read, before a request could be framed (the native front's codes)
HEAD_TOO_LONG, URL_TOO_LONG, HEADERS_TOO_LONG, MALFORMED = 1, 2, 3, 4


def refusal(what: int, max_header_bytes: int, reason: str = "") -> Refused:
    """How either server refuses input its parser or a head's limit stopped: `what` (one of
    the codes above), `reason` the parser's for MALFORMED."""
    if what == HEAD_TOO_LONG:
        return Refused(431, "the request's head (request line and headers) is over "
                            f"{max_header_bytes} bytes (ingress.max_header_bytes); send "
                            "fewer or smaller")
    if what == URL_TOO_LONG:
        return Refused(414, f"the request URL is over {max_header_bytes} bytes")
    if what == HEADERS_TOO_LONG:
        return Refused(431, f"the request headers are over {max_header_bytes} bytes "
                            "(ingress.max_header_bytes); send fewer or smaller")
    return Refused(400, f"malformed HTTP request: {reason}; send HTTP/1.1")


def framing(version: str, method: str, headers: list[tuple[bytes, bytes]]
             ) -> tuple[bool, int | None, bool]:
    """(expects 100-continue, Content-Length, chunked) of a request head, or `Refused`
    where RFC 9112 says the request cannot be framed or served."""
    if version not in ("1.1", "1.0"):
        raise Refused(400, f"HTTP/{version} is not served here; send HTTP/1.1")
    if method == "CONNECT":
        raise Refused(405, "CONNECT is not served here: this is not a proxy")
    hosts = 0
    codings: list[bytes] = []
    length: int | None = None
    expect = False
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            length = int(value) if len(value) <= 19 else 2**63  # llhttp checked the digits
        elif name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",")]
        elif name == b"expect":
            if value.strip().lower() != b"100-continue":
                raise Refused(417, f"Expect: {shown(value)} is not supported; only "
                                   "100-continue is")
            expect = True
    if hosts > 1 or (hosts == 0 and version == "1.1"):
        raise Refused(400, "an HTTP/1.1 request needs exactly one Host header"
                           f" (this one has {hosts})")
    if codings:
        if version == "1.0":
            raise Refused(400, "Transfer-Encoding is not allowed in HTTP/1.0; send "
                               "Content-Length, or HTTP/1.1")
        if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
            raise Refused(400, "Transfer-Encoding must end with one chunked coding")
        if len(codings) > 1:
            raise Refused(400, "Transfer-Encoding other than chunked is not served; send the"
                               " body plain (chunked or with Content-Length)")
    return expect, length, bool(codings)


def shown(raw: bytes) -> str:
    """`raw`, cut to 64 bytes, as it may appear in an error message."""
    text = repr(raw[:64])[1:]
    return text if len(raw) <= 64 else text + "..."
