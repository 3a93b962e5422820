"""Across hosts (`cluster.spread`): the placement selectors of replicas, batching actors
and the ingress, validated with clear messages; and the node a model's next replica goes
to, chosen from the nodes, their room and this model's replicas per node, without Ray."""

from __future__ import annotations

import pytest

from cluster.config import ConfigError, load_config
from cluster.spread import (
    NodeRoom,
    ReplicaSpread,
    actor_placement,
    label_matches,
    node_rooms,
    spread_node,
)

MODEL = {
    "name": "square", "transformer": "deployments.models:Square",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
}
ONE_CPU = {"CPU": 1.0}


def load(ingress: dict | None = None, *models: dict):
    return load_config({"ingress": ingress or {}, "models": list(models) or [MODEL]})


def node(node_id: str, cpus: float = 4, **resources: float) -> NodeRoom:
    free = {"CPU": cpus, **resources}
    return NodeRoom(node_id, free, free, {})


# -- the config ------------------------------------------------------------------------

def test_every_process_kind_can_be_placed_by_resources_and_labels():
    cfg = load({"resources": {"front": 0.001}, "labels": {"role": "front"}},
               {**MODEL, "batcher": {"placement": "actor", "resources": {"head": 0.001},
                                     "labels": {"zone": "in(a, b)"}},
                "replicas": {"resources": {"worker": 0.01}, "labels": {"ray.io/node-id": "!x1"},
                             "spread": False}})
    m = cfg.models[0]
    assert cfg.ingress.resources == {"front": 0.001} and cfg.ingress.labels == {"role": "front"}
    assert m.batcher.resources == {"head": 0.001} and m.batcher.labels == {"zone": "in(a, b)"}
    assert m.replicas.labels == {"ray.io/node-id": "!x1"} and not m.replicas.spread
    assert load().models[0].replicas.spread  # spread by default


@pytest.mark.parametrize("where, value, message", [
    ("replicas", {"resources": {"CPU": 1}}, r"names 'CPU', one of Ray's own resources: ask "
                                            r"CPUs and GPUs with num_cpus / num_gpus"),
    ("replicas", {"resources": {"fpga": -1}}, r"'fpga': -1.0 must be a name and an amount >= 0"),
    ("replicas", {"labels": {"zone": "a b"}}, r"zone: 'a b' is not a Ray label selector: "
                                              r"write a value, '!value', 'in\(a,b\)'"),
    ("replicas", {"labels": {"-bad": "x"}}, r"key '-bad' is not a Ray label key"),
    ("batcher", {"placement": "actor", "labels": {"zone": "in()"}}, r"not a Ray label selector"),
    ("batcher", {"resources": {"head": 1}},
     r"model 'square': batcher \{'resources': \{'head': 1.0\}\} places batching actors, but "
     r"its engine runs in the ingress .*: set batcher.placement to 'actor', or place the "
     r"ingress instead \(ingress.resources / ingress.labels\)"),
    ("replicas", {"in_process": True, "labels": {"zone": "a"}},
     r"in_process=true with labels=\{'zone': 'a'\}"),
])
def test_placement_settings_are_validated_saying_what_to_write(where, value, message):
    with pytest.raises(ConfigError, match=message):
        load(None, {**MODEL, where: value})


def test_the_ingress_resources_and_labels_are_validated():
    with pytest.raises(ConfigError, match=r"ingress\.resources.*names 'GPU'"):
        load({"resources": {"GPU": 1}})
    with pytest.raises(ConfigError, match=r"ingress\.labels.*'in\(a,\)' is not a Ray label"):
        load({"labels": {"zone": "in(a,)"}})


def test_models_sharing_a_batching_actor_must_place_it_alike():
    grouped = {"placement": "actor", "group": "g"}
    a = {**MODEL, "name": "a", "batcher": {**grouped, "resources": {"head": 1}}}
    b = {**MODEL, "name": "b", "batcher": grouped}
    with pytest.raises(ConfigError, match=r"models 'a' and 'b' share batching actor group 'g' "
                                          r"but place it differently"):
        load(None, a, b)
    load(None, a, {**b, "batcher": {**grouped, "resources": {"head": 1}}})


def test_actor_options_carry_only_what_is_set():
    assert actor_placement({}, {}) == {}
    assert actor_placement({"head": 0.001}, {"role": "front"}) == {
        "resources": {"head": 0.001}, "label_selector": {"role": "front"}}


@pytest.mark.parametrize("selector, labels, match", [
    ({"zone": "a"}, {"zone": "a"}, True),
    ({"zone": "a"}, {"zone": "b"}, False),
    ({"zone": "a"}, {}, False),
    ({"zone": "!a"}, {"zone": "b"}, True),
    ({"zone": "!a"}, {}, True),  # a negation matches a node without the key, as in Ray
    ({"zone": "in(a, b)"}, {"zone": "b"}, True),
    ({"zone": "in(a,b)"}, {"zone": "c"}, False),
    ({"zone": "!in(a,b)"}, {"zone": "c"}, True),
    ({"zone": "!in(a,b)"}, {"zone": "a"}, False),
    ({"zone": "a", "gpu": "!0"}, {"zone": "a", "gpu": "0"}, False),
])
def test_label_selectors_match_as_ray_matches_them(selector, labels, match):
    assert label_matches(selector, labels) is match


# -- the node of the next replica ------------------------------------------------------

def test_a_replica_goes_to_the_node_with_fewest_of_this_models_replicas():
    a, b, c = node("a"), node("b"), node("c")
    assert spread_node([a, b, c], ONE_CPU, {"a": 1, "b": 1}) == "c"
    assert spread_node([a, b], ONE_CPU, {"a": 2, "b": 1}) == "b"


def test_only_nodes_with_room_now_are_candidates():
    full, free = node("full", cpus=0.5), node("free")
    # two nodes, one with room: nothing to choose, Ray places it (there)
    assert spread_node([full, free], ONE_CPU, {"free": 1}) is None
    other = node("other")
    assert spread_node([full, free, other], ONE_CPU, {"free": 1}) == "other"
    # with room on each, an occupied node is still taken over a full one
    assert spread_node([full, free, other], ONE_CPU, {"free": 1, "other": 1}) in {"free", "other"}


def test_the_numa_resource_a_pinned_replica_asks_for_must_fit_there():
    head, worker = node("head", numa0=1), node("worker", numa1=1)
    both = [head, worker, node("idle", numa0=0)]
    # the NUMA chooser asked numa1: only the worker has it, whatever the counts say
    assert spread_node(both, {"CPU": 1, "numa1": 1}, {"worker": 5}) is None
    assert spread_node([*both, node("w2", numa1=2)], {"CPU": 1, "numa1": 1},
                       {"worker": 1}) == "w2"


def test_labels_limit_the_candidates():
    a = NodeRoom("a", ONE_CPU, ONE_CPU, {"role": "front"})
    b = NodeRoom("b", ONE_CPU, ONE_CPU, {"role": "worker"})
    c = NodeRoom("c", ONE_CPU, ONE_CPU, {"role": "worker"})
    assert spread_node([a, b, c], ONE_CPU, {"b": 1}, {"role": "!front"}) == "c"
    assert spread_node([a, b, c], ONE_CPU, {}, {"role": "front"}) is None  # one node matches


def test_ties_go_to_the_most_room_then_a_per_pool_order():
    big, small = node("big", cpus=8), node("small", cpus=2)
    assert spread_node([small, big], ONE_CPU, {}) == "big"
    nodes = [node(f"n{i}") for i in range(4)]
    firsts = {spread_node(nodes, ONE_CPU, {}, salt=f"pool-{s}") for s in range(32)}
    assert len(firsts) > 1  # pools do not all start on one node
    assert spread_node(nodes, ONE_CPU, {}, salt="x") == spread_node(nodes, ONE_CPU, {}, salt="x")


def test_a_replica_asking_for_nothing_spreads_too():
    assert spread_node([node("a"), node("b")], {"CPU": 0.0}, {"a": 1}) == "b"


def test_dead_nodes_are_no_candidates():
    nodes = [{"NodeID": "a", "Alive": False, "Resources": ONE_CPU},
             {"NodeID": "b", "Alive": True, "Resources": ONE_CPU, "Labels": {"x": "1"}},
             {"NodeID": "c", "Alive": True, "Resources": ONE_CPU}]
    rooms = node_rooms(nodes, {"b": {"CPU": 0.0}, "c": ONE_CPU})
    assert [(r.node_id, dict(r.available)) for r in rooms] == [("b", {"CPU": 0.0}),
                                                              ("c", ONE_CPU)]
    assert rooms[0].labels == {"x": "1"}
    assert [dict(r.available) for r in node_rooms(nodes, None)] == [ONE_CPU, ONE_CPU]


class Cluster:
    """Nodes that come and go, and where each fake actor runs (None: not yet)."""

    def __init__(self, *names: str) -> None:
        self.nodes = {n: node(n) for n in names}
        self.runs_on: dict[str, str | None] = {}

    def view(self) -> list[NodeRoom]:
        return list(self.nodes.values())

    def spread(self) -> ReplicaSpread:
        return ReplicaSpread(view=self.view, node_of=self.runs_on.get, salt="")


def test_replicas_created_back_to_back_go_to_different_nodes():
    cluster = Cluster("a", "b")
    spread = cluster.spread()
    first = spread.node(0, ONE_CPU, [])
    # replica 0 is not running yet (the GCS knows no node): the node it was sent to counts
    second = spread.node(1, ONE_CPU, [(0, "actor-0")])
    assert {first, second} == {"a", "b"}


def test_where_a_replica_runs_counts_over_where_it_was_sent():
    cluster = Cluster("a", "b", "c")
    spread = cluster.spread()
    sent = spread.node(0, ONE_CPU, [])
    cluster.runs_on["actor-0"] = "c" if sent != "c" else "a"  # spilled elsewhere
    third = spread.node(1, ONE_CPU, [(0, "actor-0")])
    assert third not in {cluster.runs_on["actor-0"]}


def test_a_replacement_goes_to_a_surviving_node_without_this_models_replicas():
    cluster = Cluster("a", "b", "c")
    cluster.runs_on.update({"r0": "a", "r1": "b"})
    spread = cluster.spread()
    del cluster.nodes["a"]  # node a died, and replica 0 with it: the pool replaces it
    assert spread.node(2, ONE_CPU, [(1, "r1")]) == "c"


def test_a_node_where_a_replica_was_just_lost_comes_last_for_a_while():
    cluster = Cluster("a", "b")
    now = [0.0]
    spread = ReplicaSpread(view=cluster.view, node_of=cluster.runs_on.get, salt="",
                           clock=lambda: now[0], avoid_s=60.0)
    cluster.runs_on.update({"r0": "a", "r1": "b"})
    spread.node(1, ONE_CPU, [(0, "r0")])
    # r0's host went silent: the pool dropped it; the GCS still calls node a alive, with room
    assert spread.node(2, ONE_CPU, [(1, "r1")]) == "b"
    now[0] = 61.0  # a minute on, a is a first choice again
    assert spread.node(3, ONE_CPU, [(1, "r1"), (2, "r2")]) == "a"


def test_a_replica_scaled_down_leaves_its_node_a_first_choice():
    cluster = Cluster("a", "b")
    cluster.runs_on.update({"r0": "a", "r1": "b", "r2": "b"})
    spread = cluster.spread()
    spread.node(2, ONE_CPU, [(0, "r0"), (1, "r1")])  # both known
    spread.removed(0)
    assert spread.node(3, ONE_CPU, [(1, "r1"), (2, "r2")]) == "a"


def test_options_send_the_replica_softly_so_a_full_or_gone_node_does_not_hold_it():
    a, b = "a1" * 28, "b2" * 28  # node ids as Ray writes them
    options = Cluster(a, b).spread().options(0, ONE_CPU, [])
    strategy = options["scheduling_strategy"]
    assert strategy.node_id in {a, b}
    assert strategy.soft and strategy._spill_on_unavailable
    assert Cluster("only").spread().options(0, ONE_CPU, []) == {}  # one node: Ray's default
