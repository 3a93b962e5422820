"""One request and its response on a connection of `deployments.http.pyserver.server`: the
ASGI `receive` and `send` the app is called with, and how the response is framed.

`receive` hands the app the body as it was parsed (one piece in the usual case, no
copy), resumes reading the socket as the app takes it, answers `Expect:
100-continue` when the app first waits for the body, and says `http.disconnect`
once the client is gone or the response is complete. `send` frames the response
from its headers: with a Content-Length, every part is held and the whole
response goes out in ONE `writelines` at its last part (status line, headers,
body, or a zero-copy response's parts); without one, HTTP/1.1 gets chunked
transfer encoding, one write per part (an event stream's events go out as they
come, and wait while the client's socket buffer is full), HTTP/1.0 the bytes as
they come and a close. An app that fails before anything was written gets a 500
`{"error"}`; after, the connection closes.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

from deployments.http.oip.errors import error_parts, log_error

READ_BUFFER_BYTES = 64 * 2**10  # request body buffered before the socket stops being read
_LENGTH, _CHUNKED, _UNTIL_CLOSE = "length", "chunked", "until-close"  # response framing
_STATUS = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}
_CHUNKED_HEADER = b"transfer-encoding: chunked\r\n"
_KEEP_CLOSE = b"connection: close\r\n"


def _status_line(status: int) -> bytes:
    return _STATUS.get(status) or b"HTTP/1.1 %d Status\r\n" % status


def response_head(status: int, headers: list[tuple[bytes, bytes]],
                  length: int | None) -> bytes:
    """A response's status line and headers, with its Content-Length (None: without), up
    to the connection line and the blank line: the quick lane's and the native front's."""
    lines = [_status_line(status), *(b"%s: %s\r\n" % h for h in headers)]
    if length is not None:
        lines.append(b"content-length: %d\r\n" % length)
    return b"".join(lines)


def error_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole error response that closes the connection; `body` and `headers` as
    `deployments.http.oip.errors.error_parts` makes them (the one error writer)."""
    lines = [_status_line(status), *(b"%s: %s\r\n" % h for h in headers)]
    if not any(name == b"content-type" for name, _ in headers):
        lines.append(b"content-type: application/json\r\n")
    return b"".join(lines) + b"content-length: %d\r\n" % len(body) + _KEEP_CLOSE + \
        b"\r\n" + body


class Cycle:
    """One request/response: ASGI `receive` and `send` over its connection."""

    __slots__ = ("answered", "body", "body_done", "buffered", "complete", "conn",
                 "disconnected", "expect_100", "framing", "head", "keep_alive", "on_gone",
                 "parts", "quick", "scope", "started", "waiter")

    def __init__(self, conn: Any, scope: dict, keep_alive: bool) -> None:
        self.conn, self.scope, self.keep_alive = conn, scope, keep_alive
        self.body: list[bytes] = []
        self.buffered = 0
        self.complete = False  # the whole request (body too) has been parsed
        self.body_done = False  # the app was given the body's last piece
        self.disconnected = False
        self.expect_100 = False
        self.started = False  # the app was called
        self.answered = False  # the response is complete
        self.waiter: asyncio.Future | None = None
        self.head: bytes | None = None  # status line + headers; b"" once written
        self.framing = _LENGTH
        self.parts: list[Any] = []
        self.quick = False  # the server's quick lane may take it once its body is whole
        self.on_gone: Any = None  # what the quick lane calls if the client goes away

    def start(self) -> None:
        """Answer this request (it is the connection's first unanswered one): through the
        app's quick lane if it takes it, else by running the ASGI app in a task."""
        if self.quick:
            if not self.complete:
                return  # the body is on its way: the server starts it again when whole
            self.quick = False
            self.started = True
            try:
                if self.conn.server.quick(self):
                    return
            except Exception as e:
                self._failed(e)
                return
            if self.answered:
                return
        self.started = True
        self.conn.loop.create_task(self._run())

    def whole_body(self) -> bytes:
        """The quick lane's read: the whole body at once (it is all buffered)."""
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        self.body_done = True
        return body

    def respond(self, status: int, headers: list[tuple[bytes, bytes]],
                parts: list[Any]) -> None:
        """The quick lane's answer: the whole response in one write, then the next."""
        if self.answered:
            return
        self.answered = True
        self.on_gone = None
        conn = self.conn
        if not conn.closed:
            head = response_head(status, headers, sum(map(len, parts)))
            end = _KEEP_CLOSE + b"\r\n" if not self.keep_alive else b"\r\n"
            conn.transport.writelines([head + end, *parts])
        conn.done(self)

    def _failed(self, e: BaseException) -> None:
        """The app raised out of its own error handling: a 500 if nothing was written
        yet, and the connection closes either way."""
        if self.head != b"" and not self.answered and not self.conn.closed:
            status, body, headers = error_parts(e)
            log_error(e, status, self.scope["method"], self.scope["path"])
            self.conn.transport.write(error_response(status, body, headers))
        self.answered = True
        self.conn.close()

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _run(self) -> None:
        try:
            await self.conn.server.app(self.scope, self.receive, self.send)
        except BaseException as e:  # the connection must still end right
            self._failed(e)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return
        if not self.answered:  # the app returned without a whole response
            self.conn.close()

    # -- ASGI -----------------------------------------------------------------------------
    async def receive(self) -> dict:
        while True:
            if self.body or (self.complete and not self.body_done):
                body = (b"" if not self.body else self.body[0] if len(self.body) == 1
                        else b"".join(self.body))
                self.body.clear()
                self.buffered = 0
                more = not self.complete
                self.body_done = not more
                if body:
                    self.expect_100 = False  # the client sends its body: no 100 after it
                # Reading again may parse the rest of the body at once (and complete the
                # request): that rest is the next message's, so `more` is decided first.
                self.conn.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            if self.disconnected or self.answered or self.conn.closed:
                return {"type": "http.disconnect"}
            if self.expect_100 and not self.body_done:
                self.expect_100 = False
                self.conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            if not self.body_done:
                self.conn.resume_reading()  # may parse what waited, at once: no wake comes
                if self.body or self.complete or self.disconnected or self.conn.closed:
                    continue
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.head is not None:
                raise RuntimeError("http.response.start sent twice")
            self._start(message)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.head is None:
            raise RuntimeError("http.response.body before http.response.start")
        conn = self.conn
        if conn.closed or self.answered:
            return  # the client went away: nothing to write to
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            body = b""
        framing = self.framing
        if framing is _LENGTH:  # gathered, written once at the end
            if body:
                self.parts.append(body)
            if more:
                return
            out = [self.head, *self.parts]
            self.parts = []
        elif framing is _CHUNKED:
            out = [self.head, b"%x\r\n" % len(body), body, b"\r\n"] if body else [self.head]
            if not more:
                out.append(b"0\r\n\r\n")
        else:  # _UNTIL_CLOSE (HTTP/1.0 with no length): the bytes as they come
            out = [self.head, body]
        self.head = b""
        if more:
            conn.transport.writelines(out)
            if conn.writable is not None and not conn.writable.is_set():
                await conn.writable.wait()
            return
        self.answered = True
        conn.transport.writelines(out)
        self.wake()  # a receive waiting for the end of the request learns it is over
        conn.done(self)

    def _start(self, message: dict) -> None:
        lines = [_status_line(message["status"])]
        length = close = False
        for name, value in message.get("headers", ()):
            low = name.lower()
            if low == b"content-length":
                length = True
            elif low == b"connection":
                close = close or value.lower() == b"close"
                continue  # ours, below
            elif low == b"transfer-encoding":
                continue  # ours, below
            lines.append(b"%s: %s\r\n" % (name, value))
        if not length:
            if self.scope["http_version"] == "1.1":
                self.framing = _CHUNKED
                lines.append(_CHUNKED_HEADER)
            else:
                self.framing = _UNTIL_CLOSE
                close = True  # HTTP/1.0: the end of the connection ends the body
        if close or not self.keep_alive:
            self.keep_alive = False
            lines.append(_KEEP_CLOSE)
        lines.append(b"\r\n")
        self.head = b"".join(lines)
