"""Which engine host a model gets, and the few questions the actor side asks of any host.

A model's `batching.kind` decides: `dynamic` (stateless, `BatchHost`),
`sequence` (stateful, `SequenceHost`: sticky replicas holding per-sequence
state) or `iterative` (generative, `IterativeHost`: one step at a time per
replica). The batching actor stays kind-agnostic by going through the functions here:
building the host and submitting one bundle entry. The replica pool asks any
host the same questions (`queued_work`, `busy`, `outstanding`: see
`batching.loop.LoopHost`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from batching.dynamic.host import BatchHost
from batching.dynamic.policy import DynamicPolicy
from batching.errors import InvalidRequest, RaybatchError, portable
from batching.iterative.host import IterativeHost
from batching.metrics import NULL_RECORDER, Recorder
from batching.sequence.batcher import SequenceRequest
from batching.sequence.host import SequenceHost
from batching.types import Request
from cluster.config import ConfigError, ModelConfig, import_object
from deployments.bundles import Entry
from deployments.signature import Signature

Host = BatchHost | SequenceHost | IterativeHost


def model_kind(config: ModelConfig) -> str:
    """'dynamic', 'sequence' or 'iterative'."""
    return config.batching.kind


def make_host(config: ModelConfig, on_replica_died: Callable[[Any], None],
              recorder: Recorder = NULL_RECORDER) -> Host:
    policy = config.batching
    kind = model_kind(config)
    inflight = config.replicas.max_inflight_batches
    if kind == "sequence":
        return SequenceHost(policy, max_inflight=inflight, on_replica_died=on_replica_died,
                            recorder=recorder)
    if kind == "iterative":
        count = getattr(import_object(config.transformer), "count_tokens", len)
        return IterativeHost(policy, count_tokens=count, on_replica_died=on_replica_died,
                             recorder=recorder)
    return BatchHost(dynamic_policy(config), max_inflight=inflight,
                     on_replica_died=on_replica_died, recorder=recorder,
                     collate=Signature(config).collate())


def dynamic_policy(config: ModelConfig) -> DynamicPolicy:
    """The model's DynamicPolicy, with the length of its items when it groups by length
    (the class's `item_length(items)` if it has one, else from its ragged or BYTES input)."""
    policy = config.batching
    if not policy.group_by_length or policy.length_fn is not None:
        return policy
    own = getattr(import_object(config.transformer), "item_length", None)
    length = own or Signature(config).length_fn()
    if length is None:
        raise ConfigError(f"model {config.name!r} sets batching.group_by_length but has no "
                          "ragged or BYTES input to measure: declare the varying input's "
                          "ragged axis, or give the class a static item_length(items)")
    return policy.model_copy(update={"length_fn": length})


def submit_bundle_item(host: Host, kind: str, request_id: int, entry: Entry) -> asyncio.Future:
    """Submit one bundle entry; its future. Raises the request's error (InvalidRequest,
    QueueFull, UnknownSequence...) at once."""
    items, control = entry.items, entry.control
    if kind == "sequence":
        if control is None:
            raise InvalidRequest("this model is stateful: every request needs sequence_id "
                                 "(and sequence_start on a sequence's first request)")
        if len(items) != 1:
            raise InvalidRequest(f"a stateful model takes one item per request; got "
                                 f"{len(items)}: send them one request at a time")
        sequence_id, start, end = control
        return host.submit(SequenceRequest(request_id, sequence_id, items[0], bool(start),
                                           bool(end), entry.timeout_s))
    if kind == "iterative":
        raise InvalidRequest("this model is generative: use generate or generate_stream "
                             "(POST /v2/models/{name}/generate)")
    return host.submit(Request(request_id, items, False, entry.priority, entry.timeout_s,
                               len(items), entry_requests(entry)))


def entry_requests(entry: Entry) -> int:
    """The clients' requests a bundle entry stands for (a block of the native front's:
    several), as the engine counts them; 1 where the wire said nonsense."""
    n = entry.requests
    return n if type(n) is int and n > 0 else 1


def bundle_outcome(key: Any, fut: asyncio.Future) -> tuple[Any, Any, BaseException | None]:
    """A bundle entry's answer, `(key, value, error)`, from its ended future; errors that
    are not Raybatch's own travel as `portable` copies (they cross a Ray call)."""
    error = fut.exception()
    if error is None:
        return key, fut.result(), None
    return key, None, error if isinstance(error, RaybatchError) else portable(error)
