"""Shared helpers for the engine's unit tests, handed out as fixtures.

Fixtures rather than `from conftest import ...`: pytest may swap which
`conftest` module sits in `sys.modules` when other test folders have one.
Session scope, so hypothesis tests may use them too.
"""

from __future__ import annotations

import pytest

from batching import Request


def make_request(rid, n=1, *, items=None, single=False, priority=None, timeout_s=None):
    """A request of `n` items (0..n-1 unless `items` is given)."""
    if items is None:
        items = tuple(range(n))
    return Request(rid, items, single=single, priority=priority, timeout_s=timeout_s)


def warm_latency(batcher, a_s: float, b_s: float, costs=(1, 2, 4, 8, 16, 32, 64, 128)) -> None:
    """Train `batcher.latency` to `a_s + b_s * cost` through complete(..., compute_s=...)."""
    from batching import DynamicBatcher, DynamicPolicy

    feeder = DynamicBatcher(DynamicPolicy(max_batch_size=max(costs)), latency=batcher.latency)
    for i, n in enumerate(costs):
        feeder.submit(make_request(("warm", i), n), now=0.0)
        batch = feeder.next_batch(now=0.0, free_replicas=1)
        assert batch is not None and batch.cost == n
        feeder.complete(batch.id, now=0.0, compute_s=a_s + b_s * n)
    assert batcher.latency.warm


@pytest.fixture(scope="session")
def req():
    return make_request


@pytest.fixture(scope="session")
def warm():
    return warm_latency
