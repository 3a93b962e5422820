"""The one body reader: limits enforced while reading, not after.

A body is read from the ASGI `receive` piece by piece, Content-Length or chunked
alike. A declared Content-Length past the limit is refused before a byte is read;
a body that grows past it is refused at the piece that crosses it, and the rest is
never read (the server stops reading the socket when its small buffer is full, so a
chunked body that never ends cannot grow memory). A body that stalls (no bytes for
`timeout_s`) is refused with 408, without a timer per request (see `BodyReader`).
Whoever answers after a refusal must close the connection: the unread rest would
otherwise be read as the next request.

One piece, the usual case, is returned as it came (no copy); binary tensors are then
views of it all the way to the batching actor.
"""

from __future__ import annotations

import asyncio
from typing import Any

from batching.errors import InvalidRequest
from deployments.http.oip.errors import BodyTimeout, ClientGone
from deployments.protocol import PayloadTooLarge


class BodyReader:
    """Reads request bodies within `max_bytes` and `timeout_s`; one per app.

    The stall timeout costs a request a dict entry, not a timer: one timer per event
    loop looks at every read in progress, at the earliest deadline, and cancels those
    past it (within an eighth of `timeout_s`); the cancelled read raises `BodyTimeout`.
    """

    def __init__(self, max_bytes: int, timeout_s: float) -> None:
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reads: dict[Any, float] = {}  # task -> when its read counts as stalled
        self._stalled: set[Any] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def read(self, receive: Any, declared: int | None = None) -> bytes:
        """The whole body; `declared` is its Content-Length, if sent. Raises
        `PayloadTooLarge` (413), `BodyTimeout` (408), or `ClientGone`."""
        max_bytes = self.max_bytes
        if declared is not None and declared > max_bytes:
            raise _too_large(f"is {declared} bytes (Content-Length)", max_bytes)
        task = asyncio.current_task()
        loop = self._watch(task)
        chunks: list[bytes] = []
        size = 0
        messages = 0
        try:
            while True:
                message = await receive()
                messages += 1
                kind = message["type"]
                if kind == "http.disconnect":
                    raise ClientGone("the client hung up while sending the body")
                if kind != "http.request":
                    raise InvalidRequest(f"unexpected ASGI message {kind!r} in the body")
                piece = message.get("body", b"")
                if piece:
                    size += len(piece)
                    if size > max_bytes:
                        raise _too_large(f"is more than {max_bytes} bytes", max_bytes)
                    chunks.append(piece)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one: no copy
                self._reads[task] = loop.time() + self.timeout_s  # progress
        except asyncio.CancelledError:
            if task not in self._stalled:
                raise
            _uncancel(task)
            if not messages:  # nothing at all: the resent request of a dead ingress replica
                raise BodyTimeout(
                    f"the request body stalled: none of it arrived within {self.timeout_s:g} "
                    "s; send the whole body promptly (through Serve's proxy, a request "
                    "whose ingress replica died is resent without its body: send it "
                    "again)") from None
            raise BodyTimeout(f"the request body stalled: no bytes for {self.timeout_s:g} "
                              "s; send the whole body promptly") from None
        finally:
            self._reads.pop(task, None)
            self._stalled.discard(task)

    def _watch(self, task: Any) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests): what the old one watched is gone
            self._loop, self._reads, self._stalled, self._timer = loop, {}, set(), None
        deadline = loop.time() + self.timeout_s
        self._reads[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)
        return loop

    def _check(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for task, deadline in list(self._reads.items()):
            if deadline <= now:
                del self._reads[task]
                self._stalled.add(task)
                task.cancel()
        if self._reads:
            soonest = min(self._reads.values())
            self._timer = loop.call_at(max(soonest, now + self.timeout_s / 8), self._check)


async def read_body(receive: Any, max_bytes: int, timeout_s: float,
                    declared: int | None = None) -> bytes:
    """One body, read by a `BodyReader` of its own."""
    return await BodyReader(max_bytes, timeout_s).read(receive, declared)


def _uncancel(task: Any) -> None:
    """Take our cancel back out of the task's count (Python >= 3.11), so a later cancel
    from outside is not mistaken for it."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


def _too_large(what: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body {what}, more than this server's limit of "
                           f"{limit}; send fewer items per request")
