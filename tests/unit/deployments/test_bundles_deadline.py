"""A request's one deadline (`deployments.wire.bundles`): set once by the route, carried as
an instant of the sender's monotonic clock, read once on arrival, handed to the engine as
the time left.

The stamp's node stands for a Ray node (set by hand here: no Ray). Every clock is a fake
one moved by the test (`clock`, the route's `clock=`), so what is checked is what the
test set, however fast the machine is; no test sleeps.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from batching.errors import InvalidRequest, Overloaded, UnknownSequence
from cluster.config import ModelConfig, load_config
from deployments.batcher.actor import BatcherActor
from deployments.ingress.coalesce import Coalescer
from deployments.ingress.route import ModelRoute
from deployments.wire import bundles
from deployments.wire.bundles import Arrival, Entry, entries, pack, submit_entry, time_left
from tests.conftest import arun
from tests.unit.deployments.test_coalesce import FakeActor, spin
from tests.unit.deployments.test_placement import ACCUMULATOR, backend


@pytest.fixture
def on_node():
    bundles._node[:] = ["node-a"]
    yield "node-a"
    bundles._node.clear()


@pytest.fixture
def clock(monkeypatch):
    """The node's monotonic clock as `deployments.wire.bundles` reads it, moved by the test."""
    now = SimpleNamespace(s=1000.0)
    monkeypatch.setattr(bundles, "time", SimpleNamespace(monotonic=lambda: now.s))
    return now


# -- the stamp ---------------------------------------------------------------------------
def test_outside_ray_nothing_is_stamped():
    bundles._node.clear()
    assert bundles.stamp() is None


def test_a_stamp_is_the_node_and_its_clock_as_the_bundle_leaves(on_node, clock):
    assert bundles.stamp() == (on_node, 1000.0)
    clock.s += 0.25
    assert bundles.stamp() == (on_node, 1000.25)


# -- the route sets the deadline, once ----------------------------------------------------
class Shard:
    """A submit target with the `Coalescer`'s interface: records what the route hands it."""

    outstanding = 0

    def __init__(self) -> None:
        self.submitted: list[tuple] = []

    def submit(self, items, priority, deadline, control=None, requests=1):
        self.submitted.append((priority, deadline, control, requests))
        return asyncio.Future(loop=asyncio.new_event_loop())


def route_on(shard: Shard, now: SimpleNamespace, default_timeout_s=None) -> ModelRoute:
    config = ModelConfig.model_validate({
        "name": "sq", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]})
    return ModelRoute(config, [], default_timeout_s, shards=[shard], clock=lambda: now.s)


def test_the_route_sets_one_deadline_from_when_the_request_was_received():
    now, shard = SimpleNamespace(s=100.0), Shard()
    route = route_on(shard, now)
    x = np.zeros(1, np.float32)
    route.submit(x, 2, 2.0, received_s=99.5)  # read in 0.5 s: 1.5 s of it left
    route.submit(x, None, 2.0)  # no time of receipt: from now
    route.submit(x, None, None)  # no timeout: no deadline
    assert [d for _, d, _, _ in shard.submitted] == [101.5, 102.0, None]
    assert shard.submitted[0][0] == 2
    defaulted = route_on(shard, now, default_timeout_s=1.0)  # ingress.default_timeout_s
    defaulted.submit(x, None, None, received_s=99.5)
    defaulted.submit(x, None, 5.0, received_s=99.5)  # the sooner of the two
    assert [d for _, d, _, _ in shard.submitted[3:]] == [100.5, 100.5]


def test_a_request_whose_timeout_passed_while_it_was_read_is_refused_at_the_route():
    now, shard = SimpleNamespace(s=100.0), Shard()
    route = route_on(shard, now)
    with pytest.raises(Overloaded) as e:
        route.submit(np.zeros(1, np.float32), None, 2.0, received_s=97.0)
    assert "took 3.00 s to read this request, its whole timeout of 2.00 s" in str(e.value)
    assert e.value.retry_after_s == pytest.approx(1.0) and shard.submitted == []
    with pytest.raises(InvalidRequest, match="must be > 0"):
        route.submit(np.zeros(1, np.float32), None, -1.0)


def test_the_coalescer_sends_the_routes_deadline_as_it_is_with_its_stamp(on_node, clock):
    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor, bundle_items=8, clock=lambda: clock.s)
        c.submit(np.ones(1, np.float32), None, 1001.5)
        c.submit(np.ones(1, np.float32), None, None)
        await spin()
        (bundle, _caller, sent), _ = actor.bundles[0]
        return [e.deadline for e in entries(bundle)], sent

    deadlines, sent = asyncio.run(main())
    assert deadlines == [1001.5, None] and sent == ("node-a", 1000.0)


# -- read once on arrival ----------------------------------------------------------------
def test_from_this_node_a_deadline_is_used_as_it_is(on_node, clock):
    sent = bundles.stamp()
    clock.s += 0.25  # on the way
    entry = Entry("k", [1], 2, 1003.0, ("seq", True, False), 3)
    assert Arrival(sent).entry(entry) is entry
    assert Arrival(sent).entry(Entry("k", [1])) == Entry("k", [1])  # no deadline


def test_from_another_node_the_transit_counts_as_none(on_node, clock):
    """No clock shared: what it had left when it left (3 s), from now."""
    control = ("seq", True, False)
    got = Arrival(("node-b", 50.0)).entry(Entry("k", [1], 2, 53.0, control, 3))
    assert got == Entry("k", [1], 2, 1003.0, control, 3)
    # as is a stamp of this node's that is ahead of its clock: not its clock, then
    assert Arrival((on_node, 1005.0)).entry(Entry("k", [1], None, 1006.0)).deadline == 1001.0


@pytest.mark.parametrize("sent", [None, (), ("node-a",), ["node-a", 1.0], ("node-a", "1.0"),
                                  ("node-a", float("nan")), ("node-a", 1), "node-a", 3.0,
                                  ("node-a", 1.0, 2.0), ({}, 1.0)])
def test_what_is_not_a_stamp_leaves_the_deadline_as_it_is(on_node, clock, sent):
    entry = Entry("k", [1], None, 1000.5)
    assert Arrival(sent).entry(entry) is entry


def test_a_deadline_that_passed_on_the_way_is_refused_with_retry_after(on_node, clock):
    sent = (on_node, clock.s - 2.0)  # left 2 s ago, with 0.5 s to go
    with pytest.raises(Overloaded) as e:
        Arrival(sent).entry(Entry("k", [1], None, clock.s - 1.5))
    assert "spent 2.00 s reaching its batching actor" in str(e.value)
    assert "0.50 s left of its timeout" in str(e.value)
    assert e.value.retry_after_s == pytest.approx(1.5)
    # from another node: passed before it left (the transit is not known)
    with pytest.raises(Overloaded, match=r"0\.25 s past its deadline") as e:
        Arrival(("node-b", 50.0)).entry(Entry("k", [1], None, 49.75))
    assert e.value.retry_after_s == pytest.approx(0.25)
    with pytest.raises(Overloaded, match="past its deadline"):  # unstamped
        Arrival(None).entry(Entry("k", [1], None, clock.s))


def test_a_deadline_that_is_not_an_instant_is_refused(clock):
    for bad in ("soon", float("inf"), True, [1.0]):
        with pytest.raises(InvalidRequest, match=r"instant of time\.monotonic"):
            Arrival(None).entry(Entry("k", [1], None, bad))


def test_a_stacked_bundle_arrives_with_each_entrys_own_deadline(clock):
    x = np.ones((1, 2), np.float32)
    packed = pack([Entry(k, x, None, d) for k, d in enumerate((60.0, None, 61.5))])
    assert type(packed) is bundles.Stacked and packed.deadlines == [60.0, None, 61.5]
    arrival = Arrival(("node-b", 50.0))
    assert [arrival.entry(e).deadline for e in entries(packed)] == [1010.0, None, 1011.5]


# -- the engine is handed the time left --------------------------------------------------
def test_the_engine_is_handed_the_time_left_as_its_timeout(clock):
    class Host:
        def submit(self, request):
            self.request = request
            return asyncio.Future(loop=asyncio.new_event_loop())

    host = Host()
    submit_entry(host, "dynamic", "m", 7, Entry("k", np.ones(2, np.float32), 1, 1002.5))
    assert (host.request.id, host.request.timeout_s, host.request.priority) == (7, 2.5, 1)
    submit_entry(host, "sequence", "m", 8, Entry("k", np.ones(1), None, 1000.25,
                                                 ("s", True, False)))
    assert host.request.timeout_s == 0.25
    assert time_left(None) is None and time_left(1001.0, now=1000.5) == 0.5
    with pytest.raises(Overloaded, match=r"passed 0\.50 s before its engine took it") as e:
        submit_entry(host, "dynamic", "m", 9, Entry("k", np.ones(1), None, 999.5))
    assert e.value.retry_after_s == pytest.approx(0.5)


def model_json() -> str:
    tensor = {"datatype": "FP32", "shape": [-1]}
    config = load_config({"app_name": "t", "models": [{
        "name": "sq", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}],
        "replicas": {"min_replicas": 1, "max_replicas": 1, "in_process": True},
        "batcher": {"placement": "actor"}}]})
    return config.models[0].model_dump_json()


def test_the_batching_actor_refuses_what_passed_its_deadline_on_the_way_and_serves_the_rest(
        on_node, clock):
    """The bundle left 100 s ago on the fake clock; the time left after that is handed to
    the engine (which runs on the real clock), so the ones served keep 60 s or more."""
    async def main():
        actor = BatcherActor.__ray_metadata__.modified_class(model_json())
        await actor.ready()
        x = [np.array([v], np.float32) for v in (2.0, 3.0, 4.0)]
        sent = (on_node, clock.s - 100.0)
        out = await actor.infer([Entry(1, x[0], None, sent[1] + 160.0),
                                 Entry(2, x[1], None, sent[1] + 99.0),
                                 Entry(3, x[2], None, None)], "caller", sent)
        by_key = {key: (value, error) for key, value, error in out}
        assert by_key[1][0].tolist() == [4.0] and by_key[1][1] is None
        assert by_key[3][0].tolist() == [16.0] and by_key[3][1] is None
        assert by_key[2][0] is None and isinstance(by_key[2][1], Overloaded)
        assert "spent 100.00 s reaching" in str(by_key[2][1])
        # From another node the same stamp is not trusted: the 99 s it had left is served.
        out = await actor.infer([Entry(4, x[1], None, sent[1] + 99.0)], "caller",
                                ("node-b", sent[1]))
        assert out[0][2] is None and out[0][1].tolist() == [9.0]
        # A caller of before the deadline, its timeout in a plain tuple: its bundle is
        # refused, saying why, before any of it is opened.
        with pytest.raises(InvalidRequest, match="not a timeout"):
            await actor.infer([(5, x[1], None, None), (6, x[1], None, 0.5)], "caller", sent)
        assert actor._engine(None)._by_key == {} and actor.host.open_requests == 0
        await actor.host.close(1.0, reason="test over")
    arun(main())


def test_an_engine_in_the_ingress_reads_a_client_bundles_deadlines_the_same_way(
        on_node, clock):
    """`LocalEngine`'s bundle path (a `RaybatchClient`'s bundles through the handle)."""
    one = np.array([[3]], np.int32)

    async def main():
        b = backend(ACCUMULATOR)
        sent = (on_node, clock.s - 10.0)
        return await b.infer_entries([Entry("a", one, None, sent[1] + 5.0, (1, True, False)),
                                      Entry("b", one, None, sent[1] + 60.0, (2, True, False)),
                                      Entry("c", one, None, sent[1] + 60.0, (3, False, False))],
                                     sent)

    by_key = {k: (v, e) for k, v, e in arun(main())}
    assert isinstance(by_key["a"][1], Overloaded) and by_key["a"][1].retry_after_s == 5.0
    assert int(np.asarray(by_key["b"][0]).ravel()[0]) == 3
    assert isinstance(by_key["c"][1], UnknownSequence)  # its own error, as before
