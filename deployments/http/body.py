"""The one body reader: limits enforced while reading, not after.

A body is read from the ASGI `receive` piece by piece, Content-Length or chunked
alike. A declared Content-Length past the limit is refused before a byte is read;
a body that grows past it is refused at the piece that crosses it, and the rest is
never read (the server stops reading the socket when its small buffer is full, so a
chunked body that never ends cannot grow memory). A body that stalls (no bytes for
`timeout_s`) is refused with 408. Whoever answers after a refusal must close the
connection: the unread rest would otherwise be read as the next request.

One piece, the usual case, is returned as it came (no copy); binary tensors are then
views of it all the way to the batching actor.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from batching.errors import InvalidRequest
from deployments.http.errors import BodyTimeout, ClientGone
from deployments.protocol import PayloadTooLarge

_HAS_TIMEOUT = sys.version_info >= (3, 11)


async def read_body(receive: Any, max_bytes: int, timeout_s: float,
                    declared: int | None = None) -> bytes:
    """The whole body, at most `max_bytes`; `declared` is its Content-Length, if sent.

    Raises `PayloadTooLarge` (413), `BodyTimeout` (408), or `ClientGone` when the
    client hangs up first.
    """
    if declared is not None and declared > max_bytes:
        raise _too_large(f"is {declared} bytes (Content-Length)", max_bytes)
    try:
        if not _HAS_TIMEOUT:  # Python 3.10: a timeout per piece
            return await _read(receive, max_bytes, lambda: asyncio.wait_for(receive(), timeout_s),
                               lambda: None)
        loop = asyncio.get_running_loop()
        # One timer per body, pushed back at each piece: the timeout counts from the last.
        async with asyncio.timeout(timeout_s) as deadline:
            return await _read(receive, max_bytes, receive,
                               lambda: deadline.reschedule(loop.time() + timeout_s))
    except TimeoutError:
        raise BodyTimeout(f"the request body stalled: no bytes for {timeout_s:g} s; send "
                          "the whole body promptly") from None


async def _read(receive: Any, max_bytes: int, next_message: Any, progress: Any) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await next_message()
        kind = message["type"]
        if kind == "http.disconnect":
            raise ClientGone("the client hung up while sending the body")
        if kind != "http.request":
            raise InvalidRequest(f"unexpected ASGI message {kind!r} while reading the body")
        piece = message.get("body", b"")
        if piece:
            size += len(piece)
            if size > max_bytes:
                raise _too_large(f"is more than {max_bytes} bytes", max_bytes)
            chunks.append(piece)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one: no copy
        progress()


def _too_large(what: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body {what}, more than this server's limit of "
                           f"{limit}; send fewer items per request")
