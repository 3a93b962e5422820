"""`ModelRoute`: one model's way in, the same in the ingress and in a caller's process.

It checks a request's tensors against the model's config (a clear
`InvalidRequest` otherwise), applies the default deadline, hands the request to
the shard with the least outstanding work through that shard's `Coalescer` (or
to the engine itself when it runs in this process: `deployments.backends`), and
shapes the result into the model's declared output. The Serve ingress uses it
for HTTP and handle calls; `RaybatchClient` uses the very same object in the
caller's process, talking straight to the batching actors.

Stateful models: a request is one item of one sequence, and every request of a
sequence goes to the same shard (chosen from its id), where its state is.
Generative models: `generate_stream` / `generate`, multiplexed per shard by a
`GenerateMux`; `infer` is refused with a pointer to them.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from cluster.config import ModelConfig
from deployments.coalesce import Coalescer
from deployments.generation import GenerateMux, collect
from deployments.protocol.datatypes import NUMPY_DTYPES


class ModelRoute:
    def __init__(self, config: ModelConfig, get_actors: list[Callable[[], Any]],
                 default_timeout_s: float | None = None, shards: list[Any] | None = None) -> None:
        """`get_actors`: each batching actor's getter (one `Coalescer` each); or `shards`:
        ready-made submit targets with the `Coalescer`'s interface (`submit`,
        `outstanding`), such as the engine running in this process (`LocalEngine`)."""
        (self._input,) = config.inputs
        (self._output,) = config.outputs
        self.config = config
        self.kind = config.batching.kind
        size = getattr(config.batching, "max_batch_size", 64)
        self.shards = shards or [Coalescer(get, bundle_items=size) for get in get_actors]
        iterative = self.kind == "iterative"
        self.generators = [GenerateMux(get) for get in get_actors] if iterative else []
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

    async def run(self, array: np.ndarray, priority: int | None, timeout_s: float | None,
                  sequence: tuple[Any, bool, bool] | None = None) -> dict[str, np.ndarray]:
        """Submit one request's items; its outputs, or the error that ended it.
        `sequence`: (sequence_id, start, end), for stateful models."""
        default = self.default_timeout_s
        if default is not None:
            timeout_s = min(timeout_s, default) if timeout_s else default
        if self.kind == "sequence":
            control = self._control(array, sequence)
            shard = self.shards[shard_of(control[0], len(self.shards))]
            value = await shard.submit(array, priority, timeout_s, control)
            return {self._output.name: np.asarray([value], dtype=self._dtype)}
        if self.kind == "iterative":
            raise InvalidRequest(f"model {self.config.name!r} is generative: use generate or "
                                 f"generate_stream (POST /v2/models/{self.config.name}/generate)")
        shards = self.shards
        shard = shards[0] if len(shards) == 1 else min(shards, key=lambda c: c.outstanding)
        value = await shard.submit(array, priority, timeout_s)
        return {self._output.name: np.asarray(value, dtype=self._dtype)}

    def _control(self, array: np.ndarray,
                 sequence: tuple[Any, bool, bool] | None) -> tuple[Any, bool, bool]:
        name = self.config.name
        if sequence is None or sequence[0] in (None, 0, ""):
            raise InvalidRequest(f"model {name!r} is stateful: every request needs a "
                                 "sequence_id (a positive integer or a non-empty string), and "
                                 "sequence_start=true on a sequence's first request")
        sequence_id, start, end = sequence
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)) or (
                isinstance(sequence_id, int) and sequence_id < 0):
            raise InvalidRequest(f"sequence_id={sequence_id!r} must be a positive integer or "
                                 "a non-empty string")
        if len(array) != 1:
            raise InvalidRequest(f"model {name!r} is stateful: a request carries one item of "
                                 f"one sequence, got {len(array)}; send them one by one")
        return sequence_id, bool(start), bool(end)

    async def infer(self, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Handle-API parameters: priority, timeout_s, and for stateful models
        sequence_id, sequence_start, sequence_end."""
        params = parameters or {}
        sequence = None
        if params.get("sequence_id") is not None:
            sequence = (params["sequence_id"], params.get("sequence_start", False),
                        params.get("sequence_end", False))
        return await self.run(self.input_array(inputs), params.get("priority"),
                              params.get("timeout_s"), sequence)

    def generate_stream(self, prompt: Any, params: dict[str, Any] | None = None
                        ) -> AsyncIterator[dict[str, Any]]:
        """A generation's events: {"text_output", "index"} per step, then one with
        "final": true, "finish_reason" and token counts. Closing it early cancels it."""
        if self.kind != "iterative":
            raise InvalidRequest(f"model {self.config.name!r} does not generate text: use infer")
        params = dict(params or {})
        default = self.default_timeout_s
        if default is not None and "timeout" not in params:
            given = params.get("timeout_s")
            params["timeout_s"] = min(given, default) if given else default
        mux = min(self.generators, key=lambda g: g.outstanding)
        return mux.stream(prompt, params)

    async def generate(self, prompt: Any, params: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
        """A whole generation: {"text_output", "finish_reason", "num_tokens", ...}."""
        return await collect(self.generate_stream(prompt, params))


def shard_of(sequence_id: int | str, shards: int) -> int:
    """The shard that holds a sequence: stable across processes (no salted hash())."""
    if isinstance(sequence_id, int):
        return sequence_id % shards
    return zlib.crc32(sequence_id.encode()) % shards
