"""A dynamic model's replica actor with `read_ahead`, on Ray: with two pipeline slots, the
batch sent while another runs is read (unpickled) during that run, on the direct
connection's thread (or on a second Ray thread, without one), and the model still runs
every batch on one thread of its own; with one slot, a batch is read only once the one
before has ended. Every batch gets its own answers.

"While another runs" is a state the test sets, not a moment it guesses: the first batch
is held at a gate file, the second is sent once the model notes (a file) that the first
runs, and, with two slots, the gate opens once the replica notes that it read the second.
How busy the replica's pipeline keeps the model is a benchmark's figure
(`python -m benchmarks.placement.replica_pipeline`), never this test's."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cluster.config import ModelConfig
from deployments.replica.pool import ReplicaPool
from tests.conftest import HANG_S, arun, until
from tests.models import READ_AT, Marked, ReadWhileRunning

pytestmark = pytest.mark.integration


class Noted(Marked):
    """A `Marked` item that also leaves a file `read-<value>` in `folder` when the
    replica's process unpickles it (the test process can see that)."""

    def __init__(self, value: float, folder: str) -> None:
        super().__init__(value)
        self.folder = folder

    def __getstate__(self) -> tuple[float, str]:
        return self.value, self.folder

    def __setstate__(self, state: tuple[float, str]) -> None:
        value, self.folder = state
        super().__setstate__(value)
        Path(self.folder, f"read-{value:g}").touch()


class HeldWhileGated(ReadWhileRunning):
    """`ReadWhileRunning`, each batch held while the file `gate` in `folder` exists (at
    most HANG_S) instead of for a fixed time; a batch that starts leaves a file
    `running-<its first value>` there."""

    def __init__(self, folder: str) -> None:
        super().__init__(delay_ms=0.0)
        self.folder = Path(folder)

    def transform(self, values: list[float]) -> np.ndarray:
        started = time.monotonic()
        first, last = self.last
        ahead = all(first <= READ_AT.get(v, -1.0) < last for v in values)
        tag = self.threads.setdefault(threading.get_ident(), len(self.threads))
        (self.folder / f"running-{values[0]:g}").touch()
        while (self.folder / "gate").exists() and time.monotonic() < started + HANG_S:
            time.sleep(0.005)
        self.last = (started, time.monotonic())
        return np.array([[float(ahead), float(tag)]] * len(values), dtype=np.float32)


def config(inflight: int, folder: Path, link: bool) -> ModelConfig:
    return ModelConfig(
        name="readahead", transformer="tests.integration.test_replica_threads:HeldWhileGated",
        init_kwargs={"folder": str(folder)},
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        batching={"max_batch_size": 8, "max_queue_delay_s": 0.0},
        replicas={"num_cpus": 0.1, "max_inflight_batches": inflight, "read_ahead": True,
                  "link": link},
        warmup={"enabled": False},
    )


@pytest.mark.parametrize("link", [True, False], ids=["link", "ray-calls"])
@pytest.mark.parametrize("inflight, read_ahead", [(2, 1.0), (1, 0.0)])
def test_the_next_batch_is_read_while_one_runs_and_the_model_keeps_one_thread(
        ray_address, tmp_path, inflight, read_ahead, link):
    folder, gate = tmp_path, tmp_path / "gate"
    pool = ReplicaPool(config(inflight, folder, link), host=None)
    _, client = pool._create()

    def there(name: str):
        return lambda: (folder / name).exists()

    async def main():
        await client.info()  # ready
        if link:  # a batch as a Ray call while the direct connection opens; then on it
            await client.run([Noted(0.5, str(folder))])
            await until(lambda: client._dialer.live() is not None, "the direct connection",
                        timeout_s=HANG_S)
        gate.touch()
        first = asyncio.ensure_future(client.run([Noted(1.0, str(folder)),
                                                  Noted(2.0, str(folder))]))
        await until(there("running-1"), "the first batch to run", timeout_s=HANG_S)
        second = asyncio.ensure_future(client.run([Noted(3.0, str(folder))]))
        if inflight > 1:  # read (on the connection's thread, or Ray's second) meanwhile
            await until(there("read-3"), "the second batch to be read", timeout_s=HANG_S)
        else:  # one thread reads and runs: it cannot be read before the first returns
            await asyncio.sleep(0.5)  # room for a wrong read-ahead to show
            assert not (folder / "read-3").exists(), "read while the first batch ran"
        gate.unlink()
        third_after = await first
        return third_after, await second

    try:
        (a, _), (b, _) = arun(main(), timeout_s=HANG_S + 60)
    finally:
        gate.unlink(missing_ok=True)
        client.stop()
    assert len(a) == 2 and len(b) == 1  # each batch got its own answers
    assert [float(row[0]) for row in b] == [read_ahead]
    # one model thread throughout (the device thread; without one, the thread that reads)
    assert len({float(row[1]) for row in [*a, *b]}) == 1


@pytest.mark.parametrize("read_ahead", [True, False])
def test_the_replica_pipeline_benchmark_runs_every_batch(ray_address, read_ahead):
    from benchmarks.placement.replica_pipeline import measure

    r = arun(measure("sleep", 20, 8, 2, read_ahead), timeout_s=HANG_S)
    assert (r["batches"], r["read_ahead"], r["inflight"]) == (20, read_ahead, 2)
    # What the replica reports, whatever the machine's speed: each batch's compute time
    # covers the model's own run (`sleep` sleeps 2 ms + 0.05 ms an item, a floor), and
    # counts only it, not its wait behind the batch before it: one model thread runs the
    # batches one after another, so their compute times, summed, fit in the wall time
    # (busy <= 1; 2 if a batch's wait were counted). How close to 1 is a benchmark's.
    assert r["mean_compute_ms"] >= 2.0
    assert 0 < r["busy"] <= 1.05
