"""`raybatch status` says which node runs what: each replica and batching actor (and the
ingress replicas), with the node's address and its id's short form, in the text and in
`--json`; built from the GCS's tables, here written by hand."""

from __future__ import annotations

from raybatch.nodes import annotate, ingress_lines, placement_lines
from raybatch.watch import model_view, row

HEAD, WORKER = "aa11" * 14, "bb22" * 14
NODES = [{"NodeID": HEAD, "NodeManagerAddress": "10.0.0.1", "Alive": True},
         {"NodeID": WORKER, "NodeManagerAddress": "10.0.0.2", "Alive": True}]


def actor(name: str, node: str, ip: str) -> dict:
    return {"Name": name, "State": "ALIVE", "Address": {"NodeID": node, "IPAddress": ip}}


ACTORS = {
    "1": actor("SERVE_DEPLOYMENT_ACTOR::app::Ingress::v1::batcher-square", HEAD, "10.0.0.1"),
    "2": actor("SERVE_REPLICA::app#Ingress#x1", WORKER, "10.0.0.2"),
    "3": actor("SERVE_DEPLOYMENT_ACTOR::other::Ingress::v1::batcher-square", WORKER, "x"),
    "4": actor("SERVE_REPLICA::other#Ingress#y", HEAD, "10.0.0.1"),
    "5": {"Name": "", "State": "ALIVE", "Address": {"NodeID": WORKER}},  # a model replica
}


def stats() -> dict:
    return {
        "square": {"kind": "dynamic", "batching_actors": ["batcher-square"], "replica_info": [
            {"index": 0, "state": "ALIVE", "node_id": HEAD},
            {"index": 1, "state": "ALIVE", "node_id": WORKER},
            {"index": 2, "state": "PENDING"}]},
        "mlp": {"kind": "dynamic", "placement": "ingress", "replica_info": []},
    }


def test_json_names_the_node_of_every_replica_batching_actor_and_ingress_replica():
    out = annotate(stats(), "app", NODES, ACTORS)
    square = out["square"]
    assert [r.get("node_ip") for r in square["replica_info"]] == ["10.0.0.1", "10.0.0.2", None]
    assert square["batching_actors"] == [{"name": "batcher-square", "state": "ALIVE",
                                          "node_id": HEAD, "node_ip": "10.0.0.1"}]
    ingress = [{"name": "app#Ingress#x1", "state": "ALIVE", "node_id": WORKER,
                "node_ip": "10.0.0.2"}]  # of this app only
    assert square["ingress_replicas"] == out["mlp"]["ingress_replicas"] == ingress
    assert out["mlp"]["batching_actors"] == []
    assert sorted(out) == ["mlp", "square"]  # the top level stays one key per model


def test_a_batching_actor_the_gcs_does_not_list_says_so():
    out = annotate(stats(), "app", NODES, {})
    assert out["square"]["batching_actors"][0]["state"] == "not found"
    assert ingress_lines(out) == []


def test_the_text_names_each_actors_node_and_host():
    out = annotate(stats(), "app", NODES, ACTORS)
    assert placement_lines(out["square"]) == [
        f"  batching actor batcher-square: ALIVE, node {HEAD[:8]} (host 10.0.0.1)"]
    assert placement_lines(out["mlp"]) == ["  engine: in each ingress replica"]
    assert ingress_lines(out) == ["ingress: 1 replicas",
                                  f"  app#Ingress#x1: ALIVE, node {WORKER[:8]} (host 10.0.0.2)"]


def test_the_live_view_counts_the_nodes_the_running_replicas_are_on():
    s = stats()["square"]
    v = model_view("square", s, None, None)
    assert v.nodes == 2 and row(v)[-1] == "2 +1 pending on 2 nodes"
    one = {**s, "replica_info": s["replica_info"][:1]}
    assert row(model_view("square", one, None, None))[-1] == "1 on 1 node"
