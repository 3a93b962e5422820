"""`raybatch up`'s view of what is pending, against the session's real Ray: Ray takes an
actor's resources before its process runs, so actors that started, or are starting, leave
less free than the next one asks; only the actor Ray holds queued waits for resources."""

from __future__ import annotations

import os
import time

import pytest

from cluster.demands import queued_for, waiting_demands
from raybatch.startup import pending_actors, why_pending
from tests.conftest import HANG_S, wait_until

pytestmark = pytest.mark.integration


class HeldStart:
    """An actor whose constructor waits while the file `gate` exists (at most 60 s)."""

    def __init__(self, gate: str) -> None:
        give_up = time.monotonic() + 60
        while os.path.exists(gate) and time.monotonic() < give_up:
            time.sleep(0.01)

    def ready(self) -> bool:
        return True


def test_only_the_actor_ray_holds_queued_is_said_to_wait_for_resources(ray_address,
                                                                       tmp_path):
    import ray

    gate = tmp_path / "gate"
    gate.touch()
    free = ray.available_resources().get("CPU", 0.0)
    ask = round(free * 0.4, 2)  # two fit in what is free, the third does not
    assert ask >= 0.1, f"the session Ray has {free} CPUs free"
    cls = ray.remote(HeldStart)
    actors = [cls.options(num_cpus=ask).remote(str(gate)) for _ in range(3)]
    try:
        def view() -> tuple[list[str], list[str]]:
            free_now, waiting = ray.available_resources(), waiting_demands()
            out = sorted(why_pending(a, free_now, waiting)
                         for a in pending_actors(prefix="HeldStart"))
            # two actors hold their CPUs (their constructors wait at the gate), the third
            # is queued: less is free than any of them asks; Ray reports its queue within
            # about a second
            left = free_now.get("CPU", 0.0)
            return out, ["initialising", "initialising",
                         f"waiting for resources: asks CPU {ask:g}, free CPU {left:g}"]

        wait_until(lambda: (lambda out, expected: out == expected)(*view()),
                   timeout_s=HANG_S, what="two actors initialising and a third queued")
        out, expected = view()
        assert out == expected, out  # and it stays so while the gate is closed
        # what a replica pool asks of the same queue before it warns (`cluster.demands`)
        waiting = waiting_demands()
        assert queued_for({"CPU": ask}, waiting), waiting
        assert not queued_for({"CPU": round(ask + 0.05, 2)}, waiting), waiting
    finally:
        gate.unlink()
        for actor in actors:
            ray.kill(actor)


def test_an_actor_no_node_can_place_is_queued_for_what_it_asks(ray_address):
    """What makes a replica pool warn (`cluster.demands.queued_for`): an ask no node has,
    more CPUs than any node or a resource no node advertises, is in Ray's queue."""
    import ray

    cls = ray.remote(HeldStart)
    asks = [{"CPU": 0.1, "raybatch_nowhere": 1.0}, {"CPU": 1000.0}]
    actors = [cls.options(num_cpus=0.1, resources={"raybatch_nowhere": 1}).remote(""),
              cls.options(num_cpus=1000).remote("")]
    try:
        wait_until(lambda: all(queued_for(a, waiting_demands()) for a in asks),
                   timeout_s=HANG_S, what="both asks in Ray's queue of waiting demands")
    finally:
        for actor in actors:
            ray.kill(actor)
