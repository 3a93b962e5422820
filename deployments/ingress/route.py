"""`ModelRoute`: one model's way in, the same in the ingress and in a caller's process.

It checks a request's tensors against the model's declared inputs (a clear
`InvalidRequest` otherwise; `deployments.signature`), sets the request's one deadline
(its timeout, or the default one, from when it was received: an instant of this node's
monotonic clock that travels with it, `deployments.wire.bundles`), hands the request to
the shard with the least outstanding work through
that shard's `Coalescer` (or to the engine itself when it runs in this process:
`deployments.ingress.placement`), and shapes the result into the model's declared outputs
(a multi-tensor model's request carries a `TensorBatch` of every input and gets
back every output). The Serve ingress uses it for HTTP, gRPC and handle calls;
`RaybatchClient` uses the very same object in the caller's process, talking
straight to the batching actors.

Stateful models: a request is one item of one sequence, and every request of a
sequence goes to the same shard (chosen from its id), where its state is.
Generative models: `generate_stream` / `generate`, multiplexed per shard by a
`GenerateMux` (or streamed from the engine in this process); `infer` is refused
with a pointer to them.
Given `metrics`, it counts the requests it refuses itself and those lost with a
batching actor (`deployments.metrics.CallerMetrics`); the actors count the rest.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from batching.dynamic.policy import DynamicPolicy, TimeoutAction
from batching.errors import InvalidRequest, Overloaded
from batching.tensors import TensorBatch
from cluster.config import ModelConfig
from deployments.ingress.coalesce import Coalescer
from deployments.metrics import CallerMetrics
from deployments.protocol.binary import PayloadTooLarge, is_seconds, is_uint
from deployments.protocol.wording import generative_only, no_correlation_id, one_item_per_sequence
from deployments.signature import Signature
from deployments.wire.generation import GenerateMux, collect, generate_request
from deployments.wire.keepalive import Keepalive


class ModelRoute:
    def __init__(self, config: ModelConfig, get_actors: list[Callable[[], Any]],
                 default_timeout_s: float | None = None,
                 metrics: CallerMetrics | None = None,
                 shards: list[Any] | None = None,
                 generators: list[Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`get_actors`: each batching actor's getter (one `Coalescer` each, and one
        `GenerateMux` each for a generative model); or `shards`: ready-made submit
        targets with the `Coalescer`'s interface (`submit`, `outstanding`), such as the
        engine running in this process (`LocalEngine`), and `generators`: ready-made
        stream sources with the `GenerateMux`'s (`stream`, `outstanding`). `clock`: the
        node's monotonic clock, which deadlines are instants of."""
        self.signature = Signature(config)
        self.config = config
        self.kind = config.batching.kind
        self.metrics = metrics
        size = config.batch_size
        lost = None if metrics is None else lambda n: metrics.count("worker_died", n)
        link = config.batcher.link
        group = config.batcher.group  # the actor runs several models: calls name this one
        keepalive, hard = Keepalive.of(config.replicas), hard_timeout(config.batching)
        self.shards = shards or [Coalescer(get, bundle_items=size, on_lost=lost, link=link,
                                           model=config.name if group else None,
                                           keepalive=keepalive, hard_timeout=hard)
                                 for get in get_actors]
        iterative = self.kind == "iterative"
        self.generators = generators if generators is not None else (
            [GenerateMux(get) for get in get_actors] if iterative else [])
        self.default_timeout_s = default_timeout_s
        self.max_request_items = config.max_request_items
        self._clock = clock

    def _invalid(self, message: str) -> InvalidRequest:
        """The error of a request this route refuses itself, counted as `invalid` (those
        the batching actor refuses, it counts)."""
        if self.metrics is not None:
            self.metrics.count("invalid")
        return InvalidRequest(message)

    def input_array(self, inputs: dict[str, np.ndarray]) -> np.ndarray | TensorBatch:
        """The request's items, checked against the model's inputs (`Signature.items`):
        its one input's array, or a TensorBatch of all of them."""
        try:
            items = self.signature.items(inputs)
        except InvalidRequest as e:
            raise self._invalid(str(e)) from None
        if len(items) > self.max_request_items:
            raise self._too_many(len(items))
        return items

    def decoded_array(self, inputs: dict[str, np.ndarray],
                      batch_size: int | None) -> np.ndarray | TensorBatch:
        """As `input_array`, for inputs the protocol codec decoded against this model's
        `ModelSpec` (`deployments.ingress.deployment.model_spec`, from the same config), which
        checked what `Signature.items` checks (names, datatypes, ranks, fixed dims, one
        non-empty batch dim `batch_size`; None: it saw no batch dim, and checks all)."""
        if batch_size is None:
            return self.input_array(inputs)
        if batch_size > self.max_request_items:
            raise self._too_many(batch_size)
        names = self.signature.inputs
        if len(names) == 1:
            return inputs[self.signature.single_input]
        return TensorBatch({name: inputs[name] for name in names})

    def _too_many(self, items: int) -> PayloadTooLarge:
        if self.metrics is not None:
            self.metrics.count("invalid")
        return PayloadTooLarge(f"the request carries {items} items; model "
                               f"{self.config.name!r} takes at most {self.max_request_items} "
                               "per request (limits.max_request_items): split it")

    async def run(self, array: np.ndarray | TensorBatch, priority: int | None,
                  timeout_s: float | None,
                  sequence: tuple[Any, bool, bool] | None = None,
                  received_s: float | None = None) -> dict[str, np.ndarray]:
        """Submit one request's items; its outputs, or the error that ended it.
        `sequence`: (sequence_id, start, end), for stateful models. `received_s`: when
        the request reached the server (`time.monotonic()`); its timeout counts from
        then, so the time spent reading it is not granted again (default: now)."""
        return self.outputs(await self.submit(array, priority, timeout_s, sequence, received_s))

    def submit(self, array: np.ndarray | TensorBatch, priority: int | None,
               timeout_s: float | None, sequence: tuple[Any, bool, bool] | None = None,
               received_s: float | None = None, requests: int = 1) -> asyncio.Future:
        """`run` up to the wait, for a caller that waits by callback (the HTTP server's
        quick lane): the future of the engine's raw value (`outputs` shapes it);
        cancelling it cancels the request. Raises what `run` raises before it waits.
        `requests`: the clients' requests `array` stands for (the native front's blocks),
        as the metrics count them."""
        default = self.default_timeout_s
        if default is not None:
            timeout_s = min(timeout_s, default) if timeout_s else default
        deadline = self._deadline(timeout_s, received_s, requests) if timeout_s else None
        if self.kind == "sequence":
            control = self._control(array, sequence)
            shard = self.shards[shard_of(control[0], len(self.shards))]
            return shard.submit(array, priority, deadline, control)
        if self.kind == "iterative":
            raise self._invalid(generative_only(self.config.name))
        shards = self.shards
        shard = shards[0] if len(shards) == 1 else min(shards, key=lambda c: c.outstanding)
        return shard.submit(array, priority, deadline, None, requests)

    def withdraw(self, future: asyncio.Future, rows: Any) -> bool:
        """Withdraw the rows `rows` of a block `submit` returned `future` for, what of them
        its shard still holds queued (the native front's clients that hung up); False if
        no shard has it open (its answer came, or it is no block)."""
        return any(shard.withdraw(future, rows) for shard in self.shards
                   if hasattr(shard, "withdraw"))

    def outputs(self, value: Any) -> dict[str, np.ndarray]:
        """The model's declared outputs from what the engine answered a request."""
        if self.kind == "sequence":
            value = _one_item(value)
        return self.signature.result(value)

    def _deadline(self, timeout_s: float, received_s: float | None,
                  requests: int = 1) -> float:
        """The request's deadline, set once here: `timeout_s` after `received_s` (default:
        now), on this node's monotonic clock; every hop after reads it as it is (another
        node's, once, on arrival: `deployments.wire.bundles.Arrival`). Overloaded (429) if
        it has passed: the server took the whole timeout to read the request, nothing of
        it ran."""
        now = self._clock()
        if timeout_s < 0:
            raise self._invalid(f"timeout_s={timeout_s} must be > 0 seconds")
        if received_s is None:
            return now + timeout_s
        deadline = received_s + timeout_s
        if deadline > now:
            return deadline
        spent = now - received_s
        if self.metrics is not None:
            self.metrics.count("queue_full", requests)
        raise Overloaded(f"the server took {spent:.2f} s to read this request, its whole "
                         f"timeout of {timeout_s:.2f} s: it is overloaded; retry later, or "
                         "raise the timeout", retry_after_s=spent - timeout_s)

    def _control(self, array: np.ndarray | TensorBatch,
                 sequence: tuple[Any, bool, bool] | None) -> tuple[Any, bool, bool]:
        name = self.config.name
        if sequence is None or sequence[0] in (None, 0, ""):
            raise self._invalid(no_correlation_id(name))
        sequence_id, start, end = sequence
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)) or (
                isinstance(sequence_id, int) and sequence_id < 0):
            raise self._invalid(f"sequence_id={sequence_id!r} must be a positive integer or "
                                 "a non-empty string")
        if len(array) != 1:
            raise self._invalid(one_item_per_sequence(name, len(array)))
        return sequence_id, bool(start), bool(end)

    async def infer(self, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Handle-API parameters (`HANDLE_PARAMETERS`): priority, timeout_s, and for
        stateful models sequence_id, sequence_start, sequence_end."""
        priority, timeout_s, sequence = self.parameters(parameters)
        return await self.run(self.input_array(inputs), priority, timeout_s, sequence)

    def parameters(self, params: Any) -> tuple[int | None, float | None,
                                                 tuple[Any, bool, bool] | None]:
        """(priority, timeout_s, sequence) of a handle call's parameters, checked as the
        HTTP and gRPC requests' are (InvalidRequest saying what to send): a misspelt
        name is refused, not ignored (`timeout`, HTTP's microseconds, would be no timeout)."""
        if params is None:
            return None, None, None
        if not isinstance(params, dict):
            raise self._invalid(f"parameters must be a dict of {list(HANDLE_PARAMETERS)}, "
                                f"got {type(params).__name__}")
        unknown = sorted(map(str, set(params) - set(HANDLE_PARAMETERS)))
        if unknown:
            hint = (" ('timeout' is HTTP's, in microseconds: here timeout_s, in seconds)"
                    if "timeout" in unknown else "")
            raise self._invalid(f"unknown parameter(s) {unknown}{hint}: a handle call takes "
                                f"{list(HANDLE_PARAMETERS)}")
        priority, timeout_s = params.get("priority"), params.get("timeout_s")
        if priority is not None and not is_uint(priority):
            raise self._invalid(f"priority must be a non-negative integer (1 = highest, "
                                f"0 = default), got {priority!r}")
        if timeout_s is not None and not is_seconds(timeout_s):
            raise self._invalid(f"timeout_s must be a non-negative number of seconds "
                                f"(0: none), got {timeout_s!r}")
        flags = [params.get(f, False) for f in ("sequence_start", "sequence_end")]
        if not all(isinstance(f, bool) for f in flags):
            raise self._invalid(f"sequence_start and sequence_end must be True or False, "
                                f"got {flags[0]!r} and {flags[1]!r}")
        sequence_id = params.get("sequence_id")
        sequence = None if sequence_id is None else (sequence_id, *flags)
        return priority, timeout_s, sequence

    def generate_stream(self, prompt: Any, params: dict[str, Any] | None = None
                        ) -> AsyncIterator[dict[str, Any]]:
        """A generation's events: {"text_output", "index"} per step, then one with
        "final": true, "finish_reason" and token counts. Closing it early cancels it."""
        if self.kind != "iterative":
            raise self._invalid(f"model {self.config.name!r} does not generate text: use infer")
        try:
            generate_request(0, prompt, params)  # a bad request fails here, counted
        except InvalidRequest as e:
            raise self._invalid(str(e)) from None
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


HANDLE_PARAMETERS = ("priority", "timeout_s", "sequence_id", "sequence_start", "sequence_end")


def hard_timeout(policy: Any) -> Callable[[Any, float | None], float | None]:
    """`(priority, timeout_s) -> seconds | None`: when the engine stops answering a request
    but with an error, by its own rule (a dynamic model's level: its default timeout, the
    request's own if it may override it, none at a `timeout_action: delay` level, which
    runs late requests instead); the ingress answers by then whatever happens upstream."""
    if not isinstance(policy, DynamicPolicy):
        return lambda priority, timeout_s: timeout_s or None
    levels = [policy.queue_policy(i) for i in range(1, policy.priority_levels + 1)]
    rules = [(q.timeout_action is TimeoutAction.DELAY, q.default_timeout_s,
              q.allow_timeout_override) for q in levels]
    default = policy.default_level

    def hard(priority: Any, timeout_s: float | None) -> float | None:
        level = priority or default
        if type(level) is not int or not 1 <= level <= len(rules):
            return timeout_s or None  # refused by the engine anyway
        delay, own, override = rules[level - 1]
        if delay:
            return None
        if timeout_s and override:
            return min(own, timeout_s) if own else timeout_s
        return own

    return hard


def _one_item(value: Any) -> Any:
    """A sequence step's result as a batch of one item (per output, for named outputs)."""
    if isinstance(value, dict):
        return {name: np.asarray(v)[None] for name, v in value.items()}
    return [value]


def shard_of(sequence_id: int | str, shards: int) -> int:
    """The shard that holds a sequence: stable across processes (no salted hash())."""
    if isinstance(sequence_id, int):
        return sequence_id % shards
    return zlib.crc32(sequence_id.encode()) % shards
