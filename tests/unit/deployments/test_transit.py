"""Time in transit to a batching actor counts against each request's timeout.

The stamp's node stands for a Ray node (set by hand here: no Ray); the actor is the real
`BatcherActor` class run in this process with an in-process replica. The clock that
stamps and measures the transit is a fake one (`clock`), so what is measured is what the
test set, however fast the machine is.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from batching.errors import Overloaded
from cluster.config import load_config
from deployments.batcher.actor import BatcherActor
from deployments.wire import transit
from deployments.wire.bundles import Entry


@pytest.fixture
def on_node():
    transit._node[:] = ["node-a"]
    yield "node-a"
    transit._node.clear()


@pytest.fixture
def clock(monkeypatch):
    """The node's monotonic clock as `deployments.wire.transit` reads it, moved by the test."""
    now = SimpleNamespace(s=1000.0)
    monkeypatch.setattr(transit, "time", SimpleNamespace(monotonic=lambda: now.s))
    return now


def test_outside_ray_nothing_is_stamped():
    transit._node.clear()
    assert transit.stamp() is None and transit.in_transit_s(None) == 0.0


def test_a_stamp_from_this_node_measures_the_time_since(on_node, clock):
    sent = transit.stamp()
    assert sent == (on_node, 1000.0)
    assert transit.in_transit_s(sent) == 0.0
    clock.s += 0.25
    assert transit.in_transit_s(sent) == 0.25
    assert transit.in_transit_s((on_node, clock.s + 5)) == 0.0  # never negative


def test_a_stamp_from_another_node_counts_as_sent_on_arrival(on_node, clock):
    assert transit.in_transit_s((on_node, clock.s - 100.0)) == 100.0
    assert transit.in_transit_s(("node-b", clock.s - 100.0)) == 0.0


@pytest.mark.parametrize("sent", [(), ("node-a",), ["node-a", 1.0], ("node-a", "1.0"),
                                  ("node-a", float("nan")), ("node-a", 1), "node-a", 3.0,
                                  ("node-a", 1.0, 2.0), ({}, 1.0)])
def test_what_is_not_a_stamp_counts_as_none(on_node, sent):
    assert transit.in_transit_s(sent) == 0.0


def test_the_transit_comes_off_the_timeout_and_the_rest_of_the_entry_stays():
    control = ("seq-1", True, False)
    assert transit.less_transit(Entry("k", [1], 2, 5.0, control, 3), 1.5) == \
        Entry("k", [1], 2, 3.5, control, 3)
    assert transit.less_transit(Entry("k", [1], None, 5.0), 0.0) == Entry("k", [1], None, 5.0)
    assert transit.less_transit(Entry("k", [1]), 9.0) == Entry("k", [1], None, None)


def test_a_request_whose_timeout_passed_on_the_way_is_refused_with_retry_after():
    with pytest.raises(Overloaded) as e:
        transit.less_transit(Entry("k", [1], None, 0.5), 2.0)
    assert "spent 2.00 s reaching its batching actor" in str(e.value)
    assert "timeout of 0.50 s" in str(e.value)
    assert e.value.retry_after_s == pytest.approx(1.5)


def model_json() -> str:
    tensor = {"datatype": "FP32", "shape": [-1]}
    config = load_config({"app_name": "t", "models": [{
        "name": "sq", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}],
        "replicas": {"min_replicas": 1, "max_replicas": 1, "in_process": True},
        "batcher": {"placement": "actor"}}]})
    return config.models[0].model_dump_json()


def test_the_batching_actor_refuses_what_timed_out_in_transit_and_serves_the_rest(
        on_node, clock):
    """The transit is 100 s of the fake clock; the timeouts left after it are the engine's
    (the real clock), so the ones served keep at least 60 s of it."""
    async def main():
        actor = BatcherActor.__ray_metadata__.modified_class(model_json())
        await actor.ready()
        x = [np.array([v], np.float32) for v in (2.0, 3.0, 4.0)]
        sent = (on_node, clock.s - 100.0)  # left 100 s ago
        out = await actor.infer([(1, x[0], None, 160.0), (2, x[1], None, 99.0),
                                 (3, x[2], None, None)], "caller", sent)
        by_key = {key: (value, error) for key, value, error in out}
        assert by_key[1][0].tolist() == [4.0] and by_key[1][1] is None
        assert by_key[3][0].tolist() == [16.0] and by_key[3][1] is None
        assert by_key[2][0] is None and isinstance(by_key[2][1], Overloaded)
        assert "spent 100.00 s reaching" in str(by_key[2][1])
        # From another node the same stamp is not trusted: the same timeout is served.
        out = await actor.infer([(4, x[1], None, 99.0)], "caller", ("node-b", sent[1]))
        assert out[0][2] is None and out[0][1].tolist() == [9.0]
        await actor.host.close(1.0, reason="test over")
    asyncio.run(asyncio.wait_for(main(), 60))
