"""One `ModelStreamInfer` call: requests in, their responses out, as each is ready.

Decides how a bidirectional stream lives and ends, as Triton's decoupled stream does:
every request read from the stream runs at once, in a task of its own, beside the
others (concurrent generations on one stream, matched by request id); whatever goes
wrong with one request becomes one `error_message` response for it and the stream
goes on. When the client half-closes (tritonclient's `stop_stream()`), what is running
finishes and then the call ends. When the client hangs up (`stop_stream(
cancel_requests=True)`, a closed channel: Serve cancels this generator, or its input
says cancelled), every request still running is cancelled and awaited before the
call returns, so each generation's event stream is closed and its cancel reaches the
engine; a request not yet started never starts.

At most `MAX_IN_FLIGHT` requests of one stream run at once; the next is read from the
stream only when one ends (backpressure, as gRPC's flow control does for a slow
server), so one stream holds bounded memory however many requests its client sends.

Serve hands the ingress method the client's requests as an async iterator
(`ray.serve.grpc_util.gRPCInputStream`: through the proxy, one actor call to the
proxy per message; with direct ingress, from the replica's own server) and sends on
whatever it yields. No protocol here: `run_one` says what a request means.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Emit = Callable[[Any], None]
_END = object()
MAX_IN_FLIGHT = 64  # requests of one stream running at once


async def serve_stream(requests: AsyncIterator[Any],
                       run_one: Callable[[Any, Emit], Awaitable[None]],
                       error_response: Callable[[Any, Exception], Any]
                       ) -> AsyncIterator[Any]:
    """Yield the responses of every request of `requests`: `run_one(request, emit)` emits
    a request's responses (and raises its error, which becomes `error_response`)."""
    out: asyncio.Queue = asyncio.Queue()
    running: set[asyncio.Task] = set()
    room = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def one(request: Any) -> None:
        try:
            await run_one(request, out.put_nowait)
        except Exception as e:  # a hang-up (CancelledError) ends it with no response
            out.put_nowait(error_response(request, e))
        finally:
            room.release()

    async def read() -> None:
        try:
            async for request in requests:
                await room.acquire()
                # Tasks take their first step in creation order, and `run_one` submits
                # before its first await: a stateful model's requests reach its engine
                # in stream order, as Triton's sequence batcher gets them.
                task = asyncio.get_running_loop().create_task(one(request))
                running.add(task)
                task.add_done_callback(running.discard)
            if not _hung_up(requests):  # half-closed: what runs still answers
                while running:
                    await asyncio.wait(set(running))
        finally:
            out.put_nowait(_END)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        while (response := await out.get()) is not _END:
            yield response
        await reader  # the stream's own error (reading the requests failed), if any
    finally:
        await _cancel_all([reader, *running])


def _hung_up(requests: Any) -> bool:
    is_cancelled = getattr(requests, "is_cancelled", None)
    return bool(is_cancelled and is_cancelled())


async def _cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancel `tasks` and wait for them: each closes its generation's events (so the
    cancel reaches the engine) before the call returns. `one` keeps its errors, and
    the reader's was raised already: nothing is left to report."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
