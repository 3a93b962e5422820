"""Which node runs what, for `raybatch status`: each model's replicas, its batching actors
and the app's ingress replicas, with the node's address and the short form of its id.

The ingress reports replicas with their node id and the names of each model's batching
actors; the GCS's node and actor tables (no dashboard needed) give the rest. `annotate`
is a plain function of those tables, tested without Ray.

    annotate(stats, "raybatch", ray.nodes(), actors(actor_state_name="ALIVE"))
    # stats["mlp"]["batching_actors"] == [{"name": "batcher-mlp", "node_id": "ab12...",
    #                                      "node_ip": "10.0.0.2", "state": "ALIVE"}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Serve's actor names (ray.serve._private): a deployment-scoped actor's ends in its name.
DEPLOYMENT_ACTOR = "SERVE_DEPLOYMENT_ACTOR::{app}::"
SERVE_REPLICA = "SERVE_REPLICA::{app}#"


def node_ips(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """`{node id: address}` of the nodes Ray knows (alive or not)."""
    return {n["NodeID"]: n.get("NodeManagerAddress", "") for n in nodes if n.get("NodeID")}


def _where(actor: Mapping[str, Any], name: str) -> dict[str, Any]:
    address = actor.get("Address") or {}
    return {"name": name, "state": actor.get("State", "?"),
            "node_id": address.get("NodeID") or None, "node_ip": address.get("IPAddress") or None}


def app_actors(actors: Mapping[str, Mapping[str, Any]], app: str
               ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """(the app's batching actors by their Raybatch name, its ingress replicas), from the
    GCS's actor table (`ray._private.state.actors()`)."""
    batchers: dict[str, list[dict[str, Any]]] = {}
    ingress: list[dict[str, Any]] = []
    scoped, replica = DEPLOYMENT_ACTOR.format(app=app), SERVE_REPLICA.format(app=app)
    for actor in actors.values():
        name = actor.get("Name") or ""
        if name.startswith(scoped):
            short = name.rsplit("::", 1)[-1]
            batchers.setdefault(short, []).append(_where(actor, short))
        elif name.startswith(replica):
            ingress.append(_where(actor, name.removeprefix("SERVE_REPLICA::")))
    return batchers, sorted(ingress, key=lambda a: a["name"])


def annotate(stats: dict[str, dict[str, Any]], app: str, nodes: Iterable[Mapping[str, Any]],
             actors: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`stats` (the ingress's `status()`) with the node of everything: `node_ip` on each
    replica, `batching_actors` (name, state, node) and `ingress_replicas` on each model."""
    ips = node_ips(nodes)
    batchers, ingress = app_actors(actors, app)
    for s in stats.values():
        for r in s.get("replica_info", []):
            if r.get("node_id"):
                r["node_ip"] = ips.get(r["node_id"])
        names = s.get("batching_actors") or []
        s["batching_actors"] = [
            where for name in names
            for where in batchers.get(name, [{"name": name, "state": "not found",
                                              "node_id": None, "node_ip": None}])]
        s["ingress_replicas"] = ingress
    return stats


def fetch_annotated(stats: dict[str, dict[str, Any]], app: str) -> dict[str, dict[str, Any]]:
    """`annotate` with the running cluster's tables (needs `ray.init`); `stats` as it was
    when they cannot be read."""
    import ray

    try:
        from ray._private.state import actors

        table = actors(actor_state_name="ALIVE")
    except Exception:  # an older or newer Ray: status without the actors' nodes
        table = {}
    return annotate(stats, app, ray.nodes(), table)


def node_text(node_id: str | None, node_ip: str | None) -> str:
    """'node 1a2b3c4d (host 10.0.0.2)': the id's short form, then the address."""
    host = f" (host {node_ip})" if node_ip else ""
    return f"node {(node_id or '?')[:8]}{host}"


def placement_lines(s: Mapping[str, Any]) -> list[str]:
    """Where a model's engine runs: its batching actors' nodes, or the ingress replicas."""
    if s.get("placement") == "ingress":
        return ["  engine: in each ingress replica"]
    return [f"  batching actor {a['name']}: {a['state']}, "
            f"{node_text(a.get('node_id'), a.get('node_ip'))}"
            for a in s.get("batching_actors", [])]


def ingress_lines(stats: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The app's ingress replicas and their nodes (the same for every model)."""
    replicas = next((s.get("ingress_replicas") for s in stats.values()), None) or []
    if not replicas:
        return []
    return [f"ingress: {len(replicas)} replicas"] + [
        f"  {r['name']}: {r['state']}, {node_text(r.get('node_id'), r.get('node_ip'))}"
        for r in replicas]
