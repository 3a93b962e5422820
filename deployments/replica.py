"""The model-replica actor: one `VectorTransformer`, run one batch at a time.

A sync Ray actor (batches run back to back on its own thread; no event loop
competes with the model for the core). Its constructor first pins the process
(`cluster.pinning.pin_replica`: whole cores of its NUMA node or its GPU's), then
builds the model on the device Ray gave it; it reports where it runs (node, CPUs
as read back with `os.sched_getaffinity`, NUMA node, pinned or not, torch
threads, GPU ids) so `raybatch status` shows the truth.
`OMP_NUM_THREADS` comes from the runtime env (set by the pool from `num_cpus`):
`torch.set_num_threads` alone left a spinning thread. With `record_metrics`, it
records each batch's compute time itself (`raybatch_batch_compute_seconds`), so
the series comes from the node the model runs on.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray

from batching.model import instantiate, run_batch
from cluster.config import ModelConfig, import_object
from cluster.pinning import pin_replica, torch_threads
from deployments.metrics import ReplicaMetrics


class ModelReplica:
    def __init__(self, model_json: str, index: int, record_metrics: bool = False) -> None:
        self.config = ModelConfig.model_validate_json(model_json)
        self.index = index
        gpu_ids = ray.get_gpu_ids() if self.config.replicas.num_gpus else []
        # Pinned before the model (and torch) load, so its threads start on their cores.
        self.placement = pin_replica(self.config.replicas, gpu_ids,
                                     owner=f"{self.config.name} replica-{index}")
        self.device = "cuda" if gpu_ids else "cpu"
        target = import_object(self.config.transformer)
        self.model = instantiate(target, (), dict(self.config.init_kwargs))
        self.model.setup(self.device)
        self._gpu_ids = [str(g) for g in gpu_ids]
        self._node_id = ray.get_runtime_context().get_node_id()
        # After pinning: whatever threads Ray's metrics start run on this replica's cores.
        self._metrics = ReplicaMetrics(self.config) if record_metrics else None

    def run(self, items: Any) -> tuple[Any, float]:
        """One batch: preprocess → transform → postprocess; returns (results, compute_s)."""
        t0 = time.perf_counter()
        results = run_batch(self.model, items)
        return results, self._elapsed(t0)

    def _elapsed(self, t0: float) -> float:
        """Seconds since `t0` (perf_counter), recorded as one batch's compute time."""
        seconds = time.perf_counter() - t0
        if self._metrics is not None:
            self._metrics.compute(seconds)
        return seconds

    # Its own thread: `raybatch status` must not wait behind a batch that runs for seconds.
    @ray.method(concurrency_group="control")
    def info(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node_id": self._node_id,
            "cpus": sorted(os.sched_getaffinity(0)),
            "num_cpus": self.config.replicas.num_cpus,
            "gpus": self._gpu_ids,
            "device": self.device,
            **self.placement.to_dict(),
            "torch_threads": torch_threads(),
        }
