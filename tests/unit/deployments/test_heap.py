"""`freeze_startup_heap`: startup's garbage is freed, what is alive is frozen out of the
collector's walks, and what comes later is collected as before, cycles included."""

from __future__ import annotations

import gc
import weakref

import pytest

from deployments.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process goes on with its collector as it was


def test_startup_garbage_is_freed_the_living_frozen_and_later_cycles_still_collected(unfrozen):
    garbage, garbage_ref = cycle()
    alive, _ = cycle()
    del garbage
    assert garbage_ref() is not None  # a cycle: only the collector frees it

    frozen = freeze_startup_heap("test")

    assert garbage_ref() is None, "startup's garbage was collected before the freeze"
    # what it froze, as counted at the freeze; a frozen object freed since (by another
    # thread of the test process: a pool's, a monitor's) leaves the count, never joins it
    assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen
    assert not any(alive is o for o in gc.get_objects()), "the living startup heap is frozen"
    later, later_ref = cycle()
    del later
    gc.collect()
    assert later_ref() is None, "a cycle made after the freeze is still collected"
    assert alive.other.other is alive


def test_the_environment_turns_it_off(unfrozen, monkeypatch):
    monkeypatch.setenv("RAYBATCH_FREEZE_HEAP", "0")
    assert freeze_startup_heap("test") == 0 == gc.get_freeze_count()
