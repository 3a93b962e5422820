"""The model-replica actor: one `VectorTransformer`, run one batch at a time.

A sync Ray actor (no event loop competes with the model for the core). With
`replicas.read_ahead` (on by default for GPU replicas) a dynamic model's replica actor
builds and runs its model on one thread of its own, the device thread, and the pool starts
it with one Ray thread per pipeline slot (`max_concurrency` = `max_inflight_batches`): Ray
reads a call's arguments, and writes its results, on the thread that took the call, so
with Ray's one thread that work sat between two batches and the device idled through it
(`benchmarks.placement.replica_pipeline` measures the share of a batch's time it took);
now the next batch is read, and the last one's results written, while the model runs, and
the model still sees one thread (a model may keep per-thread state: CUDA streams, grad
mode). A CPU model keeps Ray's one thread by default: there that work would compete with
the model for its cores (`benchmarks.placement.replica_pipeline`).
Every dynamic model's replica actor takes its batches on a direct connection from its
engine (`replicas.link`, `deployments.wire.link`) instead of a Ray call each: a thread of its
own reads them off the socket (and the engine hears it alive however long a batch
runs) and hands each to the device thread, or, without one, runs it itself, pinned
with the replica, one batch at a time (`deployments.replica.link_server`). Sequence and
generation replicas (`deployments.replica.stateful`) always keep one thread: their calls
change state in the order they are sent. Its constructor first pins the process
(`cluster.pinning.pin_replica`: whole cores of its NUMA node or its GPU's), then
builds the model on the device Ray gave it; it reports where it runs (node, CPUs
as read back with `os.sched_getaffinity`, NUMA node, pinned or not, torch
threads, GPU ids) so `raybatch status` shows the truth.
`OMP_NUM_THREADS` comes from the runtime env (set by the pool from `num_cpus`):
`torch.set_num_threads` alone left a spinning thread. With `record_metrics`, it
records each batch's compute time itself (`raybatch_batch_compute_seconds`), so
the series comes from the node the model runs on. The same class, built with
`in_process=True`, is an in-process replica (`deployments.replica.inprocess`): then it
never pins, since the process is its host's.

Before it reports ready, a replica of a dynamic or stateful model warms up (Triton's
model_warmup, `deployments.replica.warmup`): it runs synthesized or configured batches of
the configured sizes, and checks the model's answers against the declared outputs.
A replica that cannot build its model or whose model does not fit its tensors does
not raise from its constructor (Ray would bury the message in a traceback): it
reports the error in `info()`, and the pool fails the deployment with it, before
any traffic. Time to ready (setup, warm-up) is reported in `info()` and logged.
When an engine's connection to it ends, a replica asks Ray's GCS whether its actor is still
wanted and ends its own process once the GCS holds it DEAD: a process cut off or stopped
while Ray killed it may live on after Ray gave it up (`deployments.replica.wanted`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from batching.errors import RaybatchError
from batching.model import instantiate, run_batch
from cluster.config import ModelConfig, import_object
from cluster.pinning import ReplicaPlacement, pin_replica, torch_threads
from deployments.heap import freeze_startup_heap
from deployments.metrics import ReplicaMetrics
from deployments.replica.link_server import ThreadedLinkServer
from deployments.replica.wanted import WantedCheck, actor_is_dead
from deployments.replica.warmup import warm_up
from deployments.wire.dialer import listen_host
from deployments.wire.keepalive import Keepalive

log = logging.getLogger(__name__)
IN_PROCESS_NOTE = "in process: runs on its host's cores (replicas.in_process)"


class ReplicaSetupError(RaybatchError):
    """A replica could not build its model, or the model does not fit its declared tensors;
    the message says which and how to fix it."""

    http_status = 503


def reads_ahead(replica_class: type, config: ModelConfig, in_process: bool = False) -> bool:
    """Whether a replica of `replica_class` reads its next batch while it runs one."""
    return (replica_class.DEVICE_THREAD and not in_process
            and config.replicas.reads_ahead())


class ModelReplica:
    # With `replicas.read_ahead`: the model on a device thread of its own, the actor with
    # one Ray thread per pipeline slot (see the module note). False: never.
    DEVICE_THREAD = True

    def __init__(self, model_json: str, index: int, record_metrics: bool = False,
                 in_process: bool = False) -> None:
        started = time.perf_counter()
        self.config = ModelConfig.model_validate_json(model_json)
        self.index = index
        self.in_process = in_process  # built by deployments.replica.inprocess: never pins its host
        gpu_ids = ray.get_gpu_ids() if self.config.replicas.num_gpus and not in_process else []
        # Pinned before the model (and torch) load, so its threads start on their cores.
        self.placement = ReplicaPlacement(False, note=IN_PROCESS_NOTE) if in_process else \
            pin_replica(self.config.replicas, gpu_ids, owner=f"{self.config.name} replica-{index}")
        self.device = "cuda" if gpu_ids else "cpu"
        self._gpu_ids = [str(g) for g in gpu_ids]
        self._node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        # After pinning: whatever threads Ray's metrics start run on this replica's cores.
        self._metrics = ReplicaMetrics(self.config) if record_metrics else None
        self.model: Any = None
        self.error: str | None = None
        self.ready: dict[str, Any] = {}
        # In process, the host's client already runs every call on one thread of its own.
        self._device = (ThreadPoolExecutor(1, thread_name_prefix="model")
                        if reads_ahead(type(self), self.config, in_process) else None)
        self._link: ThreadedLinkServer | None = None  # the engine's connection, once asked
        self._wanted_check: WantedCheck | None = None  # asks the GCS once an engine goes
        self._one_batch = threading.Lock()  # without a device thread: see `run`
        try:
            self._on_device(self._build, started)
        except Exception as e:  # reported by info(): the pool fails the deploy with it
            self.error = str(e) if isinstance(e, RaybatchError) else f"{type(e).__name__}: {e}"
            log.error("%s replica-%d cannot serve: %s", self.config.name, index, self.error)
            return
        if not in_process:  # in process, its host freezes once ready (Serve, or the batcher)
            freeze_startup_heap(f"{self.config.name} replica-{index}")

    def _build(self, started: float) -> None:
        target = import_object(self.config.transformer)
        self.model = instantiate(target, (), dict(self.config.init_kwargs))
        self.model.setup(self.device)
        setup_s = time.perf_counter() - started
        warmup = warm_up(self.config, self.model) if self.config.batching.kind != "iterative" \
            else {"batch_sizes": [], "warmup_s": 0.0}
        self.ready = {"setup_s": round(setup_s, 3), **warmup,
                      "ready_s": round(time.perf_counter() - started, 3)}
        log.info("%s replica-%d ready in %.2f s (setup %.2f s, warm-up %.2f s: batch sizes %s)",
                 self.config.name, self.index, self.ready["ready_s"], setup_s,
                 warmup["warmup_s"], warmup["batch_sizes"])

    def _on_device(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the device thread (its exception raised here), or right here."""
        if self._device is None:
            return fn(*args)
        return self._device.submit(fn, *args).result()

    def run(self, items: Any) -> tuple[Any, float]:
        """One batch: preprocess → transform → postprocess; returns (results, compute_s),
        the time it ran (not its wait behind the batch before it). Without a device
        thread, one batch at a time: while the direct connection opens, a batch may come
        as a Ray call and the next on the connection."""
        if self._device is not None:
            return self._device.submit(self._run, items).result()
        with self._one_batch:
            return self._run(items)

    def _run(self, items: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        results = run_batch(self.model, items)
        return results, self._elapsed(t0)

    def _elapsed(self, t0: float) -> float:
        """Seconds since `t0` (perf_counter), recorded as one batch's compute time."""
        seconds = time.perf_counter() - t0
        if self._metrics is not None:
            self._metrics.compute(seconds)
        return seconds

    @ray.method(concurrency_group="control")
    def link_address(self, caller_node: str | None = None) -> tuple[str, int, bytes]:
        """Where the engine connects to send batches without a Ray call each
        (`replicas.link`, `deployments.wire.link`): a Unix socket for a caller on this node,
        this node's address for one elsewhere (`deployments.wire.endpoint`); with the token
        it must send first. Each batch
        runs as `run` does: on the device thread when it reads ahead (the connection's
        threads only read and write), else on the thread that read it, pinned where the
        replica is (`deployments.replica.link_server`: pings are answered meanwhile)."""
        if not self.DEVICE_THREAD or self.in_process:
            raise RuntimeError("only a dynamic model's replica actor takes batches on a link")
        if self._link is None:
            workers = self.config.replicas.max_inflight_batches if self._device else 1
            actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
            if actor_id is not None:  # once an engine goes: leave if Ray has given it up
                self._wanted_check = WantedCheck(lambda: actor_is_dead(actor_id),
                                                 lambda: bool(self._link.connections),
                                                 self._leave)
            self._link = ThreadedLinkServer(
                self.run, workers, initializer=self._pin_thread,
                keepalive=Keepalive.of(self.config.replicas),
                on_ended=self._wanted_check.connection_ended if self._wanted_check else None)
        return self._link.address(listen_host(caller_node))

    def _leave(self, why: str) -> None:
        """End this process: Ray has given its actor up, and no engine is connected."""
        log.warning("%s replica-%d (pid %d) ends itself: %s", self.config.name, self.index,
                    os.getpid(), why)
        if self._link is not None:
            self._link.close()
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(0)

    def _pin_thread(self) -> None:
        """Pin a thread of this replica's own making where the replica is pinned (affinity
        is a thread's: one started by a thread Ray made before the pinning would float)."""
        if self.placement.cpus:
            os.sched_setaffinity(0, set(self.placement.cpus))

    # Its own thread: `raybatch status` must not wait behind a batch that runs for seconds.
    @ray.method(concurrency_group="control")
    def info(self) -> dict[str, Any]:
        """Where the replica runs, how long it took to get ready, or why it cannot serve."""
        return {
            "index": self.index,
            **({"error": self.error} if self.error else {}),
            "in_process": self.in_process,
            "read_ahead": self._device is not None,
            # batches taken on the engine's direct connection (replicas.link)
            "link_batches": self._link.calls if self._link is not None else 0,
            "link_hosts": sorted(self._link.listeners) if self._link is not None else [],
            # times it asked the GCS whether it is still wanted, after an engine went
            "wanted_asks": self._wanted_check.asked if self._wanted_check is not None else 0,
            **self.ready,
            "pid": os.getpid(),
            "node_id": self._node_id,
            "cpus": sorted(os.sched_getaffinity(0)),
            "num_cpus": self.config.replicas.num_cpus,
            "gpus": self._gpu_ids,
            "device": self.device,
            **self.placement.to_dict(),
            "torch_threads": torch_threads(),
        }
