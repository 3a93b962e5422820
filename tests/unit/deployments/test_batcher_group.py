"""Models of one `batcher.group` share one batching actor: the app declares one actor for
them (its CPUs their sum), each model keeps an engine of its own in it (answers, stats,
cancels, drain), a caller names its model on every call, and the config refuses a group
where sharing cannot hold (not dynamic, not on an actor, sharded)."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import Draining, InvalidRequest
from cluster.config import load_config
from deployments.app import batching_actors, build_app
from deployments.batcher.actor import BatcherActor
from tests.conftest import arun

TENSOR = {"datatype": "FP32", "shape": [-1]}


def model(name: str, transformer: str = "deployments.models:Square", **extra) -> dict:
    return {"name": name, "transformer": transformer,
            "inputs": [{"name": "INPUT0", **TENSOR}], "outputs": [{"name": "OUTPUT0", **TENSOR}],
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.25,
                         "in_process": True},
            **extra}


def config(*models: dict):
    return load_config({"app_name": "t", "models": list(models)})


GROUPED = {"batcher": {"placement": "actor", "group": "small"}}


def test_the_app_declares_one_actor_for_a_group_and_one_for_each_other_model():
    cfg = config(model("a", **GROUPED), model("solo", batcher={"placement": "actor"}),
                 model("b", **GROUPED), model("here", batcher={"placement": "ingress"}))
    assert [[m.name for m in g] for g in batching_actors(cfg)] == [["a", "b"], ["solo"]]
    deployment = build_app(cfg)._bound_deployment  # the ingress, as Serve will deploy it
    actors = {a.name: a for a in deployment._deployment_config.deployment_actors}
    assert sorted(actors) == ["batcher-group-small", "batcher-solo"]
    group = actors["batcher-group-small"]
    assert group.init_kwargs["model_json"] and len(group.init_kwargs["group_json"]) == 1
    # the in-process replicas of both models live in the one actor: it asks for both
    assert group.actor_options["num_cpus"] == pytest.approx(0.5)
    assert "group_json" not in actors["batcher-solo"].init_kwargs


@pytest.mark.parametrize("extra, why", [
    ({"batcher": {"placement": "ingress", "group": "g"}}, "placement"),
    ({"batcher": {"placement": "actor", "group": "g", "shards": 2}}, "shards"),
    ({"batcher": {"placement": "actor", "group": "g"},
      "batching": {"kind": "sequence", "max_batch_size": 4}}, "dynamic"),
    ({"batcher": {"placement": "actor", "group": "no spaces"}}, "pattern"),
])
def test_a_group_that_cannot_share_is_refused_saying_why(extra, why):
    with pytest.raises(Exception, match=why):
        config(model("m", **extra))


def test_each_model_of_a_shared_actor_keeps_its_own_engine(monkeypatch):
    monkeypatch.setenv("RAYBATCH_FREEZE_HEAP", "0")  # an actor freezes its heap: not this one
    cfg = config(model("sq", **GROUPED), model("plus1", "tests.models:FailNegative", **GROUPED))
    first, second = (m.model_dump_json() for m in cfg.models)

    async def main():
        actor = BatcherActor.__ray_metadata__.modified_class(first, group_json=[second])
        await actor.ready()
        x = np.array([3.0], np.float32)
        sq = await actor.infer([(1, x, None, None)], "caller-a", None, "sq")
        plus1 = await actor.infer([(1, x, None, None)], "caller-b", None, "plus1")
        default = await actor.infer([(2, x, None, None)], "caller-a")  # its first model
        with pytest.raises(InvalidRequest, match="runs \\['plus1', 'sq'\\], not 'other'"):
            await actor.infer([(3, x, None, None)], "caller-a", None, "other")
        stats = {m: await actor.stats(m) for m in ("sq", "plus1")}
        assert await actor.cancel("caller-b", [7], "plus1") == 0  # nothing open: none found
        drained = await actor.detach("ingress-0", 1.0)
        late = await actor.infer([(4, x, None, None)], "caller-a", None, "plus1")
        for engine in actor.engines.values():  # nothing of this actor outlives the test
            engine.pool._task.cancel()
            for client in engine.host.replicas:
                client.stop()
                client._thread.shutdown(wait=True)
        return sq, plus1, default, stats, drained, late

    sq, plus1, default, stats, drained, late = arun(main())
    assert sq[0][1].tolist() == [9.0] and np.asarray(plus1[0][1]).tolist() == [4.0]
    assert default[0][1].tolist() == [9.0]
    assert stats["sq"]["success"]["count"] == 2 and stats["plus1"]["success"]["count"] == 1
    assert len(stats["sq"]["replica_info"]) == len(stats["plus1"]["replica_info"]) == 1
    assert drained["drained"] is True and drained["open_requests"] == 0
    assert isinstance(late[0][2], Draining) and "models 'sq', 'plus1'" in str(late[0][2])


def test_batching_actors_and_the_ingress_are_placed_as_the_config_says():
    place = {"resources": {"head": 0.001}, "labels": {"role": "front"}}
    cfg = load_config({"app_name": "t", "ingress": {"resources": {"front": 0.01},
                                                    "labels": {"zone": "in(a,b)"}},
                       "models": [model("a", batcher={**GROUPED["batcher"], **place}),
                                  model("b", batcher={**GROUPED["batcher"], **place}),
                                  model("solo", batcher={"placement": "actor"})]})
    deployment = build_app(cfg)._bound_deployment
    actors = {a.name: a for a in deployment._deployment_config.deployment_actors}
    group = actors["batcher-group-small"].actor_options
    assert group["resources"] == {"head": 0.001} and group["label_selector"] == {"role": "front"}
    assert "resources" not in actors["batcher-solo"].actor_options
    ingress = deployment._replica_config.ray_actor_options
    assert ingress["resources"] == {"front": 0.01}
    assert ingress["label_selector"] == {"zone": "in(a,b)"}
