"""`ModelRoute`: one model's way in, the same in the ingress and in a caller's process.

It checks a request's tensors against the model's config (a clear
`InvalidRequest` otherwise), applies the default deadline, hands the request to
the shard with the least outstanding work through that shard's `Coalescer`, and
shapes the result into the model's declared output. The Serve ingress uses it
for HTTP and handle calls; `RaybatchClient` uses the very same object in the
caller's process, talking straight to the batching actors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from cluster.config import ModelConfig
from deployments.coalesce import Coalescer
from deployments.protocol_binary import NUMPY_DTYPES


class ModelRoute:
    def __init__(self, config: ModelConfig, get_actors: list[Callable[[], Any]],
                 default_timeout_s: float | None = None) -> None:
        (self._input,) = config.inputs
        (self._output,) = config.outputs
        self.config = config
        size = config.batching.max_batch_size
        self.shards = [Coalescer(get, bundle_items=size) for get in get_actors]
        self.default_timeout_s = default_timeout_s
        self._dtype = NUMPY_DTYPES[self._output.datatype]

    def input_array(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The request's items: its one input, checked against the model's tensor spec."""
        tensor = self._input
        if set(inputs) != {tensor.name}:
            raise InvalidRequest(f"model {self.config.name!r} takes exactly one input "
                                 f"{tensor.name!r}; got {sorted(inputs)}")
        array = inputs[tensor.name]
        if not isinstance(array, np.ndarray) or array.ndim != len(tensor.shape):
            raise InvalidRequest(f"input {tensor.name!r} must be an array of rank "
                                 f"{len(tensor.shape)} with shape {list(tensor.shape)}")
        if len(array) == 0:
            raise InvalidRequest(f"input {tensor.name!r} has an empty batch dimension: "
                                 "send at least one item")
        return array

    async def run(self, array: np.ndarray, priority: int | None,
                  timeout_s: float | None) -> dict[str, np.ndarray]:
        """Submit one request's items; its outputs, or the error that ended it."""
        default = self.default_timeout_s
        if default is not None:
            timeout_s = min(timeout_s, default) if timeout_s else default
        shard = min(self.shards, key=lambda c: c.outstanding)  # least outstanding work
        value = await shard.submit(array, priority, timeout_s)
        return {self._output.name: np.asarray(value, dtype=self._dtype)}

    async def infer(self, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        params = parameters or {}
        return await self.run(self.input_array(inputs), params.get("priority"),
                              params.get("timeout_s"))
