"""What a handler returns, and how it goes out: plain ASGI messages, nothing more.

A `Reply` is a status, raw headers and a body (bytes, or parts: the JSON head and
binary tensors as views of their arrays). It goes out as one `http.response.start`
and one body message; parts go out one message each only where the app talks to
the HTTP server itself (`zero_copy`) and they are large enough for a copy to cost
more than a write; elsewhere (under Serve's wrapper, which pickles messages) they
are joined. An `EventStream` is a generation's server-sent events, pumped until the
last one or until the client hangs up, which closes the generation (and so cancels
it) at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from deployments.http.oip.errors import ClientGone

JSON = (b"content-type", b"application/json")
CLOSE = (b"connection", b"close")
EVENT_STREAM = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
ZERO_COPY_MIN_BYTES = 64 * 2**10  # below this, one joined write beats a write per part


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes | list[Any] = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class EventStream:
    """Encoded SSE events (the first already produced: errors before it are 4xx), and
    what ends the generation behind them; `send_stream` calls `close` exactly once."""

    events: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


def json_reply(doc: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), [JSON])


async def send_reply(send: Any, reply: Reply, close: bool, zero_copy: bool) -> None:
    body = reply.body
    parts = None
    if type(body) is list:
        size = sum(map(len, body))
        if zero_copy and len(body) > 1 and size >= ZERO_COPY_MIN_BYTES:
            parts = body
        else:
            body = b"".join(body)
    else:
        size = len(body)
    headers = [*reply.headers, (b"content-length", b"%d" % size)]
    if close:
        headers.append(CLOSE)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if parts is None:
        await send({"type": "http.response.body", "body": body})
        return
    for part in parts[:-1]:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": parts[-1]})


async def send_stream(send: Any, receive: Any, stream: EventStream) -> bool:
    """Send `stream` as SSE; False if the client hung up before the end. Either way the
    stream is closed, which ends (cancels) the generation if it is still running."""
    try:
        await send({"type": "http.response.start", "status": 200, "headers": EVENT_STREAM})
        pump = asyncio.ensure_future(_pump(send, stream.events))
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this task is cancelled (Serve cancels it on a hang-up)
            pump.cancel()
            gone.cancel()
            await asyncio.gather(pump, gone, return_exceptions=True)
        return not pump.cancelled() and pump.exception() is None
    finally:
        await stream.close()


async def _pump(send: Any, events: AsyncIterator[bytes]) -> None:
    async for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def unless_gone(receive: Any, work: Awaitable[Any]) -> Any:
    """`work`'s result, or `ClientGone` as soon as the client hangs up (its body read),
    with `work` cancelled: a generation waiting in the queue, or running for an answer
    nobody will read, ends there instead of running for nobody."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this task is cancelled (Serve cancels it on a hang-up)
        gone.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        raise ClientGone("the client hung up before the answer")
    return task.result()


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
