"""Which engine host a model gets, built once when its engine starts.

A model's `batching.kind` decides: `dynamic` (stateless, `BatchHost`),
`sequence` (stateful, `SequenceHost`: sticky replicas holding per-sequence
state) or `iterative` (generative, `IterativeHost`: one step at a time per
replica). The batching actor stays kind-agnostic by building its host here and handing it
each request as the wire's record says (`deployments.wire.bundles.submit_entry`). The
replica pool asks any host the same questions (`queued_work`, `busy`, `outstanding`: see
`batching.loop.LoopHost`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batching.dynamic.host import BatchHost
from batching.dynamic.policy import DynamicPolicy
from batching.iterative.host import IterativeHost
from batching.metrics import NULL_RECORDER, Recorder
from batching.sequence.host import SequenceHost
from cluster.config import ConfigError, ModelConfig, import_object
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
