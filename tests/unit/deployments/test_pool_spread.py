"""The pool asks Ray for each replica actor's node (`cluster.spread`): spread softly
across nodes by default, the model's label selector always, nothing with `spread: false`.
Without Ray: the cluster's nodes are written by hand."""

from __future__ import annotations

from types import SimpleNamespace

from cluster.config import ModelConfig
from cluster.spread import NodeRoom, ReplicaSpread
from deployments.replica.pool import ReplicaPool

A, B = "a1" * 28, "b2" * 28


def pool(**replicas) -> ReplicaPool:
    config = ModelConfig.model_validate({
        "name": "square", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        "replicas": {"num_cpus": 0.5, **replicas}})
    p = ReplicaPool(config, host=None)
    rooms = [NodeRoom(n, {"CPU": 2.0}, {"CPU": 2.0}, {"zone": "a"}) for n in (A, B)]
    p.__dict__["_spread"] = ReplicaSpread(view=lambda: rooms, node_of=lambda actor: None,
                                          salt="")
    return p


def test_replicas_of_one_pool_are_sent_to_different_nodes():
    p = pool(min_replicas=2, max_replicas=2)
    first = p._actor_options(0)["scheduling_strategy"]
    p._starting[0] = SimpleNamespace(index=0, actor=object())  # created, not yet running
    second = p._actor_options(1)["scheduling_strategy"]
    assert {first.node_id, second.node_id} == {A, B} and first.soft and second.soft
    assert p._actor_options(1)["resources"] == {}


def test_labels_always_and_no_node_without_spread():
    options = pool(spread=False, labels={"zone": "a"})._actor_options(0)
    assert options["label_selector"] == {"zone": "a"} and "scheduling_strategy" not in options
    assert "label_selector" not in pool()._actor_options(0)
