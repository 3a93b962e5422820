"""A replica without a process after the pool's patience (`ReplicaPool._report_pending`):
a warning that it is not placed only where Ray holds its resources queued; one that has
its resources and is starting its process (a busy machine), or is building its model, is
logged at INFO. Ray's state is stubbed: no Ray, no sleep."""

from __future__ import annotations

import logging

import pytest

import deployments.replica.pool as pool_module
from cluster.demands import bundle_key
from deployments.replica.pool import ReplicaPool
from tests.conftest import arun as run
from tests.unit.deployments.test_replica_threads import config


class Pending:
    def __init__(self, placed: bool) -> None:
        self._placed = placed

    def placed(self) -> bool:
        return self._placed


@pytest.mark.parametrize(("placed", "waiting", "level", "words"), [
    (False, {bundle_key({"CPU": 0.5, "numa0": 1}): 1}, logging.WARNING, "is not placed"),
    (False, None, logging.WARNING, "is not placed"),  # Ray did not say: warn
    (False, {}, logging.INFO, "process is still starting"),
    (False, {bundle_key({"CPU": 2}): 3}, logging.INFO, "process is still starting"),
    (True, {bundle_key({"CPU": 0.5}): 1}, logging.INFO, "placed and still starting"),
])
def test_only_a_replica_ray_holds_queued_is_warned_about(monkeypatch, caplog, placed,
                                                         waiting, level, words):
    monkeypatch.setattr(pool_module, "waiting_demands", lambda: waiting)
    monkeypatch.setattr(pool_module.ray, "available_resources", lambda: {"CPU": 1.8})
    pool = ReplicaPool(config(read_ahead=None), host=None)
    with caplog.at_level(logging.INFO, logger=pool_module.__name__):
        run(pool._report_pending(0, Pending(placed)))
    [record] = caplog.records
    assert record.levelno == level and words in record.getMessage(), record.getMessage()
