"""Deleting an app stops its batching actors and, with them, every replica actor they own;
and the replicas its ingress replicas own (models with `batcher.placement: ingress`).

Run on a small app of its own, deployed beside the shared one, which must not be touched.
Actors are read from the GCS (`ray._private.state.actors()`), which needs no dashboard.
"""

from __future__ import annotations

import numpy as np
import pytest

from cluster.config import load_config
from tests.conftest import CONFIGS, wait_until

pytestmark = pytest.mark.integration


def actors() -> dict[str, dict]:
    from ray._private import state

    return state.actors()


def owned_by(table: dict[str, dict], owner_ids: set[str]) -> set[str]:
    """Ids of the ModelReplica actors whose owner is one of the actors `owner_ids`: owned
    from its address, and started after it (a worker's address is used again once its
    process is gone: the replicas of an actor that died before, in the session's other
    tests, would otherwise count)."""

    def where(address: dict) -> tuple:
        return address["IPAddress"], address["Port"]

    since = min(table[a]["StartTime"] for a in owner_ids)

    owners = {where(table[a]["Address"]) for a in owner_ids}
    return {a for a, info in table.items() if info["ActorClassName"] == "ModelReplica"
            and where(info["OwnerAddress"]) in owners and info["StartTime"] >= since}


def test_deleting_the_app_leaves_no_batcher_or_replica_alive(app):
    from ray import serve

    from deployments.app import build_app

    config = load_config(CONFIGS / "small.yaml")
    name = config.app_name
    handle = serve.run(build_app(config), name=name, route_prefix=config.ingress.route_prefix)
    for model in ("square", "square-local"):
        out = handle.infer.remote(model, {"INPUT0": np.array([5.0], np.float32)})
        np.testing.assert_array_equal(out.result(timeout_s=30)["OUTPUT0"], [25.0])

    table = actors()
    ingress = {a for a, info in table.items() if info["State"] == "ALIVE"
               and info["ActorClassName"].startswith(f"ServeReplica:{name}:")}
    assert len(ingress) == 1, {table[a]["ActorClassName"] for a in table}
    local = owned_by(table, ingress)
    assert len(local) == 1 and all(table[a]["State"] == "ALIVE" for a in local)
    batchers = {a for a, info in table.items() if info["ActorClassName"] == "BatcherActor"
                and f"::{name}::" in info["Name"] and info["State"] == "ALIVE"}
    assert len(batchers) == 1, [table[a]["Name"] for a in batchers]
    replicas = owned_by(table, batchers)
    assert len(replicas) == 1 and all(table[a]["State"] == "ALIVE" for a in replicas)
    shared = {a for a, info in table.items() if info["State"] == "ALIVE"
              and info["ActorClassName"] in ("BatcherActor", "ModelReplica")} - batchers - replicas
    shared -= local
    assert shared, "the shared app's actors should be listed too"

    serve.delete(name)

    def lingering() -> dict[str, str]:
        t = actors()
        return {a: t[a]["ActorClassName"] for a in batchers | replicas | local
                if t[a]["State"] != "DEAD"}

    wait_until(lambda: not lingering(), timeout_s=30, what=f"the actors of {name!r} to die")
    t = actors()
    alive = {a for a, info in t.items() if info["State"] == "ALIVE"
             and info["ActorClassName"] in ("BatcherActor", "ModelReplica")}
    assert alive == shared, "after the delete, exactly the shared app's actors are alive"
    assert app.stats("square")["replicas"] == 1
