"""A fake backend and an in-process ASGI driver: the HTTP front without Ray or sockets.

`FakeBackend` serves `square` (FP32 [-1] -> its square), `echo` (FP64 [-1, 2], returned
as sent, so a test can make the model "return" NaN) and `words`, a generative model
that streams one word per step and records which generations were closed early.
`call(app, ...)` drives one request through the app with the body in the pieces the
test chooses, and can stall, never end, or hang up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from batching.iterative.policy import IterativePolicy
from deployments.http import HttpLimits, ModelEntry, OipApp, UnknownModel
from deployments.protocol import InferRequest, ModelSpec, TensorSpec
from deployments.protocol.openai import ChatTemplate
from deployments.protocol.wording import unknown_model, unknown_version
from deployments.wire.generation import generate_request

SQUARE = ModelEntry("square", "1", ModelSpec(
    "square", inputs=[TensorSpec("INPUT0", "FP32", [-1])],
    outputs=[TensorSpec("OUTPUT0", "FP32", [-1])], max_batch_size=64))
ECHO = ModelEntry("echo", "1", ModelSpec(
    "echo", inputs=[TensorSpec("INPUT0", "FP64", [-1, 2])],
    outputs=[TensorSpec("OUTPUT0", "FP64", [-1, 2])], max_batch_size=64))
POLICY = IterativePolicy(max_tokens_limit=1_000_000)
WORDS = ModelEntry("words", "1", ModelSpec(
    "words", inputs=[TensorSpec("text_input", "BYTES", [1])],
    outputs=[TensorSpec("text_output", "BYTES", [1])]), generative=True,
    chat_template=ChatTemplate())


class FakeBackend:
    def __init__(self) -> None:
        self.entries = {m.name: m for m in (SQUARE, ECHO, WORDS)}
        self.not_ready: set[str] = set()
        self.closed: list[str] = []  # prompts whose generation was closed before its end
        self.step = asyncio.Event()  # set: the stream advances freely; clear: it waits
        self.step.set()
        self.fail_with: BaseException | None = None  # infer raises it
        self.fail_after: int | None = None  # a stream raises after this many events
        self.cancelled = 0  # quick-lane requests whose future was cancelled (hung up)
        self._tasks: set[asyncio.Task] = set()

    def models(self) -> list[ModelEntry]:
        return list(self.entries.values())

    def model(self, name: str, version: str | None = None) -> ModelEntry:
        m = self.entries.get(name)
        if m is None:
            raise UnknownModel(unknown_model(name, self.entries))
        if version not in (None, m.version):
            raise UnknownModel(unknown_version(name, version, m.version))
        return m

    async def ready(self, model: ModelEntry) -> bool:
        return model.name not in self.not_ready

    async def stats(self, model: ModelEntry) -> dict[str, Any]:
        return {"name": model.name, "version": model.version, "inference_count": 0}

    async def infer(self, model: ModelEntry, request: InferRequest,
                    received_s: float | None = None) -> dict[str, np.ndarray]:
        await self.step.wait()
        if self.fail_with is not None:
            raise self.fail_with
        x = request.inputs["INPUT0"]
        return {"OUTPUT0": x * x if model is SQUARE else x}

    def submit_infer(self, model: ModelEntry, request: InferRequest,
                     received_s: float | None = None,
                     requests: int = 1) -> tuple[asyncio.Future, Any]:
        """`infer` as the quick lane calls it: a future (cancelling it is counted in
        `cancelled`, as an engine would drop the request) and the identity shaper."""
        future = asyncio.get_running_loop().create_future()

        async def run() -> None:
            try:
                value = await self.infer(model, request, received_s)
            except Exception as e:
                if not future.done():
                    future.set_exception(e)
            else:
                if not future.done():
                    future.set_result(value)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def ended(f: asyncio.Future) -> None:
            if f.cancelled():
                self.cancelled += 1
                task.cancel()

        future.add_done_callback(ended)
        return future, lambda value: value

    async def generate(self, model: ModelEntry, text: Any, params: dict) -> dict[str, Any]:
        words = [e["text_output"] async for e in self.generate_stream(model, text, params)]
        return {"text_output": "".join(words), "final": True, "finish_reason": "length",
                "num_tokens": len(words) - 1, "prompt_tokens": len(text)}

    def generate_stream(self, model: ModelEntry, text: Any,
                        params: dict) -> AsyncIterator[dict[str, Any]]:
        request = generate_request(0, text, params)  # the real checks of a generate body
        if not request.prompt:
            raise InvalidRequest("the prompt is empty: send some text")
        POLICY.prompt_tokens_of(request)  # the engine's checks of its prompt and stops
        n = POLICY.max_tokens_of(3 if request.max_tokens is None else request.max_tokens)
        return self._words(text, n)

    async def _words(self, text: str, n: int) -> AsyncIterator[dict[str, Any]]:
        done = False
        try:
            for i in range(n):
                await asyncio.sleep(0)  # a step takes a loop turn, as a real one does
                await self.step.wait()
                if i == self.fail_after:
                    raise RuntimeError("the model broke mid-stream")
                yield {"text_output": f"w{i} ", "index": i}
            done = True
            yield {"text_output": "", "final": True, "finish_reason": "length",
                   "num_tokens": n, "prompt_tokens": len(text)}
        finally:
            if not done:
                self.closed.append(text)


def make_app(**limits: Any) -> tuple[OipApp, FakeBackend]:
    backend = FakeBackend()
    return OipApp(backend, HttpLimits(**limits)), backend


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    pieces: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The message of a `{"error": str}` body (and nothing else), checked."""
        assert self.headers.get("content-type") == "application/json", self.headers
        doc = json.loads(self.body)
        assert isinstance(doc, dict) and set(doc) == {"error"}, doc
        assert isinstance(doc["error"], str)
        return doc["error"]


FOREVER = object()  # a body piece: stall here forever
NEVER_ENDS = object()  # as the body: 1 KiB pieces, forever


def _pieces(body: Any) -> Iterable[Any]:
    if body is NEVER_ENDS:
        return itertools.repeat(b"x" * 1024)
    if isinstance(body, (bytes, bytearray)):
        return [bytes(body)]
    return list(body)


async def call(app: Any, method: str, path: str, body: Any = b"",
               headers: Iterable[tuple[str, str]] = (), *, chunked: bool = False,
               hang_up_after_events: int | None = None, direct: bool = False,
               client: str = "127.0.0.1") -> Answer:
    """One request through `app`. `body`: bytes, a list of pieces (`FOREVER` stalls),
    or `NEVER_ENDS`; without `chunked`, a Content-Length is sent for bytes bodies."""
    raw = [(k.lower().encode(), v.encode()) for k, v in headers]
    if isinstance(body, (bytes, bytearray)) and not chunked and method == "POST":
        raw.append((b"content-length", str(len(body)).encode()))
    elif body is NEVER_ENDS or chunked or isinstance(body, list):
        raw.append((b"transfer-encoding", b"chunked"))
    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "headers": raw, "client": (client, 5000), "query_string": b""}
    pieces = iter(_pieces(body))
    pending = next(pieces, None)
    answer = Answer(0, {}, b"")
    finished = asyncio.Event()
    events = 0

    async def receive() -> dict:
        nonlocal pending
        if pending is FOREVER:
            await asyncio.Event().wait()
        if pending is not None:
            piece, pending = pending, next(pieces, None)
            return {"type": "http.request", "body": piece, "more_body": pending is not None}
        if hang_up_after_events is not None:
            while events < hang_up_after_events and not finished.is_set():
                await asyncio.sleep(0)
            return {"type": "http.disconnect"}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal events
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            piece = bytes(message.get("body", b""))
            answer.pieces.append(piece)
            answer.body += piece
            events += piece.startswith(b"data: ")
            if not message.get("more_body", False):
                finished.set()

    await (app.direct if direct else app)(scope, receive, send)
    return answer


def infer_body(data: list, datatype: str = "FP32", shape: list | None = None,
               **extra: Any) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "datatype": datatype,
                       "shape": [len(data)] if shape is None else shape, "data": data}], **extra}
    return json.dumps(doc).encode()
