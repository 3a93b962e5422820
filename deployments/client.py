"""`RaybatchClient`: a caller's concurrent requests, coalesced into few handle calls.

A Serve handle call costs about a millisecond of CPU; a Python caller (another
deployment, a Ray task) with a thousand concurrent requests would pay that a
thousand times. The client gathers the calls made during one event-loop tick
(same model, same parameters) into one `infer_bundle` call, and hands each
caller its own result or its own exception.

    client = RaybatchClient()                       # the app named "raybatch"
    out = await client.infer("mlp", {"INPUT0": x})  # {"OUTPUT0": y}
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np


class RaybatchClient:
    def __init__(self, handle: Any = None, app_name: str = "raybatch") -> None:
        if handle is None:
            from ray import serve

            handle = serve.get_app_handle(app_name)
        self._handle = handle
        self._pending: dict[tuple[str, str], list[tuple[dict, asyncio.Future]]] = {}
        self.calls = 0

    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Outputs of one request; raises the error that ended it (QueueFull, ...)."""
        loop = asyncio.get_running_loop()
        key = (model, json.dumps(parameters or {}, sort_keys=True))
        fut = loop.create_future()
        group = self._pending.setdefault(key, [])
        group.append((inputs, fut))
        if len(group) == 1:
            loop.call_soon(self._flush, key)
        return await fut

    def _flush(self, key: tuple[str, str]) -> None:
        group = self._pending.pop(key, [])
        if group:
            self.calls += 1
            asyncio.get_running_loop().create_task(self._send(key, group))

    async def _send(self, key: tuple[str, str], group: list[tuple[dict, asyncio.Future]]) -> None:
        model, params = key
        try:
            results = await self._handle.infer_bundle.remote(
                model, [inputs for inputs, _ in group], json.loads(params) or None)
        except Exception as e:
            results = [e] * len(group)
        for (_, fut), result in zip(group, results):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
