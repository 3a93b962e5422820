"""In-process model replicas (`replicas.in_process`): the model beside its engine.

A model with `replicas.in_process: true` starts no actor per replica. Each replica is
the same replica class a replica actor runs (`ModelReplica`, `SequenceReplica`,
`StepReplica`), built in the engine's process (the ingress replica, or the batching
actor) on a thread of its own; every call on the model (constructor, batches, releases,
steps) runs on that thread, one at a time, as in an actor. That is how `@serve.batch`,
LitServe and BentoML run a model: no Ray call per batch (the batch is neither pickled
nor copied), and no worker process to start (seconds of CPU each on a small machine:
`benchmarks.placement.startup`).

The price, said where the setting is documented: the model shares its host's cores and
GIL (a model that holds the GIL slows the front), it is not pinned, and a batch that
runs past `batch_timeout_s` cannot be stopped: that call fails with `ReplicaHung`, the
replica's other calls with `ReplicaDied` (the engine runs those batches elsewhere), the
replica is dropped and replaced, and its stuck thread ends when the model returns.
Results are handed over, not copied: a model must not reuse an output buffer across
batches (a replica actor's results are copied by Ray; here they are not).

`InProcessClient` is the replica and its client in one: the pool asks it `info()`
(waits for the model to be built), `stop()`, and `placed()`, as it asks a
`RayReplicaClient`; the host calls `run` / `release` / `step`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

from batching.errors import BatchTimedOut
from batching.loop import ReplicaDied, ReplicaHung

log = logging.getLogger(__name__)


class InProcessClient:
    """One in-process replica of `replica_class` (built on its own thread at once) and
    the client the engine calls it through."""

    def __init__(self, replica_class: type, model_json: str, index: int,
                 record_metrics: bool = False, timeout_s: float | None = None) -> None:
        self.index = index
        self.name = f"replica-{index}"
        self.timeout_s = timeout_s
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"raybatch-{self.name}")
        self._built = asyncio.wrap_future(self._thread.submit(
            replica_class, model_json, index, record_metrics, True))
        self._pending: set[asyncio.Future] = set()
        self._stopped = False  # stopped (hung, scaled down, or failed to build)

    async def info(self) -> dict[str, Any]:
        """Where it runs and how long it took to get ready (waits until it is built)."""
        replica = await asyncio.shield(self._built)
        return replica.info()  # reads attributes only: no need to queue behind a batch

    def placed(self) -> bool:
        return True  # nothing to place: it runs here

    def stop(self) -> None:
        """Take no more calls; calls still queued end with ReplicaDied."""
        self._stopped = True
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def run(self, items: Any) -> tuple[Any, float]:
        return await self._call("run", items)

    async def release(self, sequence_ids: list[Any]) -> None:
        await self._call("release", sequence_ids)

    async def step(self, join: list[Any], leave: list[Any]) -> tuple[list[Any], float]:
        return await self._call("step", join, leave)

    async def _call(self, method: str, *args: Any) -> Any:
        if self._stopped:
            raise ReplicaDied(f"{self.name}: stopped")
        replica = await asyncio.shield(self._built)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        try:
            done = self._thread.submit(getattr(replica, method), *args)
        except RuntimeError as e:  # stopped between the check and here
            raise ReplicaDied(f"{self.name}: stopped") from e
        done.add_done_callback(lambda d: _hand_back(loop, self._deliver, fut, d))
        # A timer, not asyncio.wait_for: no extra task per batch (as RayReplicaClient).
        timer = None if self.timeout_s is None else loop.call_later(
            self.timeout_s, self._hung, fut)
        self._pending.add(fut)
        try:
            return await fut
        finally:
            self._pending.discard(fut)
            if timer is not None:
                timer.cancel()

    def _deliver(self, fut: asyncio.Future, done: concurrent.futures.Future) -> None:
        if fut.done():  # failed already (hung or stopped), or its caller went away
            return
        if done.cancelled():
            fut.set_exception(ReplicaDied(f"{self.name}: stopped"))
        elif done.exception() is not None:
            fut.set_exception(done.exception())  # the model's own error, as it raised it
        else:
            fut.set_result(done.result())

    def _hung(self, fut: asyncio.Future) -> None:
        if fut.done() or self._stopped:
            return
        log.error("%s ran a batch for more than batch_timeout_s=%s s: dropping it as hung "
                  "(in process: its thread ends when the model returns)", self.name,
                  self.timeout_s)
        self.stop()
        fut.set_exception(ReplicaHung(f"{self.name}: hung", BatchTimedOut(
            f"the model did not finish this request's batch within "
            f"replicas.batch_timeout_s={self.timeout_s} s on {self.name}, which was "
            f"dropped and replaced; raise batch_timeout_s if batches run this long")))
        for other in self._pending:  # queued behind the hung batch: run elsewhere
            if not other.done():
                other.set_exception(ReplicaDied(f"{self.name}: dropped as hung"))


def _hand_back(loop: asyncio.AbstractEventLoop, deliver: Any, fut: asyncio.Future,
               done: concurrent.futures.Future) -> None:
    """On the replica's thread: hand a finished call back to its loop. A loop closed
    meanwhile (its process or test is gone; a hung batch ends after it) has nobody
    waiting: nothing to hand back, and nothing to log (a traceback printed from this
    thread would race the main thread's `ast.parse` on Python 3.11, gh-106905)."""
    try:
        loop.call_soon_threadsafe(deliver, fut, done)
    except RuntimeError:  # "Event loop is closed"
        pass
