"""With `replicas.read_ahead` (default: GPU replicas only), a dynamic model's replica actor
runs with one Ray thread per pipeline slot, so Ray reads the next batch (and writes the
last one's results) while the model runs; the model itself is built and runs on one
device thread, one batch at a time, and the compute time it reports is the batch's own,
not its wait behind the one before. Without Ray: the calls come from several threads
here, as from Ray's thread pool. CPU replicas by default, in-process replicas, sequence
and generation replicas keep running on the calling thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from batching.model import VectorTransformer
from cluster.config import ModelConfig
from deployments.replica.actor import ModelReplica
from deployments.replica.pool import ReplicaPool

RUN_S = 0.05


class ModelClock:
    """`time` as `deployments.replica.actor` reads it: `perf_counter` moves only while a model
    runs, RUN_S a batch, so a compute time says which batches it spans, not how fast the
    machine was."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


CLOCK = ModelClock()


class Overlap(VectorTransformer):
    """FP32 [-1] → x * 2 in RUN_S (on `CLOCK` too); counts how many batches run at once,
    and on which threads it was built and run."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.guard = threading.Lock()
        self.threads = {threading.get_ident()}

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        with self.guard:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.get_ident())
            CLOCK.now += RUN_S
        time.sleep(RUN_S)  # a window for a second batch to overlap, were one let in
        with self.guard:
            self.running -= 1
        return xs * 2


def config(kind: str = "dynamic", **replicas: Any) -> ModelConfig:
    replicas.setdefault("read_ahead", True)
    batching: dict[str, Any] = {"kind": kind, "max_batch_size": 8}
    if kind == "dynamic":
        batching["max_queue_delay_s"] = 0.0
    return ModelConfig(
        name="m", transformer=f"{__name__}:Overlap",
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1]}],
        batching=batching, replicas={"num_cpus": 0.5, "pin": "off", **replicas},
        warmup={"enabled": False},
    )


def test_batches_sent_on_several_threads_run_one_at_a_time_on_one_thread_timed_alone(
        monkeypatch):
    import deployments.replica.actor as replica_module

    monkeypatch.setattr(replica_module, "time", CLOCK)
    replica = ModelReplica(config().model_dump_json(), 0)
    assert replica.error is None
    batches = [[float(i), float(i + 1)] for i in range(0, 8, 2)]
    with ThreadPoolExecutor(4) as threads:
        answers = list(threads.map(replica.run, batches))
    assert replica.model.most == 1  # never two batches in the model at once
    assert len(replica.model.threads) == 1  # built and run on the device thread
    assert threading.get_ident() not in replica.model.threads
    assert replica.info()["read_ahead"] is True
    for batch, (results, compute_s) in zip(batches, answers):
        assert [float(r) for r in results] == [2 * x for x in batch]
        # its own run on the model's clock, not the batches it queued behind
        assert compute_s == pytest.approx(RUN_S)


@pytest.mark.parametrize("inflight", [2, 3])
def test_a_dynamic_replica_actor_gets_a_thread_per_pipeline_slot(inflight):
    pool = ReplicaPool(config(max_inflight_batches=inflight), host=None)
    assert pool._threads() == {"max_concurrency": inflight}


def test_one_batch_in_flight_reads_nothing_ahead():
    c = config(max_inflight_batches=1)
    assert not c.replicas.reads_ahead() and ReplicaPool(c, host=None)._threads() == {}


def test_sequence_replicas_keep_one_thread():
    pool = ReplicaPool(config("sequence", max_inflight_batches=2), host=None)
    assert pool._threads() == {}


@pytest.mark.parametrize("read_ahead, num_gpus, expected", [
    (None, 0.0, False), (None, 1.0, True), (None, 0.5, True),
    (True, 0.0, True), (False, 1.0, False)])
def test_read_ahead_by_default_for_gpu_replicas_only(read_ahead, num_gpus, expected):
    c = config(read_ahead=read_ahead, num_gpus=num_gpus, max_inflight_batches=2)
    assert c.replicas.reads_ahead() is expected
    pool = ReplicaPool(c, host=None)
    assert pool._threads() == ({"max_concurrency": 2} if expected else {})


def test_a_cpu_replica_runs_on_the_calling_thread_by_default():
    replica = ModelReplica(config(read_ahead=None).model_dump_json(), 0)
    assert replica._device is None and replica.info()["read_ahead"] is False
    replica.run([1.0])
    assert threading.get_ident() in replica.model.threads


def test_read_ahead_is_refused_for_in_process_replicas():
    with pytest.raises(ValueError, match="read_ahead=true"):
        config(read_ahead=True, in_process=True)


def test_a_model_error_is_raised_to_the_caller_from_the_device_thread():
    replica = ModelReplica(config().model_dump_json(), 0)
    with pytest.raises(ValueError):
        replica.run(["not a number"])


@pytest.mark.parametrize("in_process", [True, False])
def test_sequence_replicas_and_in_process_replicas_run_on_the_calling_thread(in_process):
    from deployments.replica.stateful import SequenceReplica

    if in_process:
        replica = ModelReplica(config().model_dump_json(), 0, in_process=True)
    else:
        replica = SequenceReplica(config("sequence").model_dump_json(), 0)
    assert replica._device is None
