"""Ray's queue of waiting demands (`cluster.demands`): what counts as an actor queued for
resources, as against one whose resources are held while its process starts."""

from __future__ import annotations

from cluster.demands import bundle_key, queued_for


def test_a_bundle_key_drops_memory_and_zeros_and_sorts():
    assert bundle_key({"memory": 5.0, "GPU": 1, "CPU": 0.0, "numa0": 2}) == \
        (("GPU", 1.0), ("numa0", 2.0))


def test_an_ask_is_queued_only_where_a_waiting_bundle_holds_all_of_it():
    waiting = {bundle_key({"CPU": 0.1, "numa0": 1}): 1, bundle_key({"GPU": 1}): 0}
    assert queued_for({"CPU": 0.1}, waiting)  # the bundle adds the NUMA node it was given
    assert not queued_for({"CPU": 0.25}, waiting)  # another amount: someone else's
    assert not queued_for({"GPU": 1}, waiting)  # a count of none: nothing queued
    assert not queued_for({"CPU": 0.1}, {})  # Ray says nothing is queued: it is starting


def test_where_ray_does_not_say_an_ask_counts_as_queued():
    assert queued_for({"CPU": 0.1}, None)  # a warning too many beats none
