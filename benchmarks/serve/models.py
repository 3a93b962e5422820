"""The three models of the Serve comparison, their payloads, configs and ceilings.

Each model is one `ModelConfig` (the Raybatch config entry), used as is by the
Raybatch app and by the two Ray Serve baselines, so all three run the same
transformer class with the same batching limits. Payloads are single items
(a leading batch dimension of 1), since the comparison is about batching many
single-item requests.

Ceilings are measured in this process, before any load: `sleep` and `mlp` on
full batches back to back (`benchmarks.common.models.measure_ceiling`); `minilm` as
its own offline `SentenceTransformer.encode(batch_size=64)` on one thread pinned
to the core its replicas are pinned to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common.models import MLP_DIM, SLEEP_DIM, measure_ceiling
from cluster.config import ModelConfig

MAX_BATCH_SIZE = 64
MODEL_CORE = 1  # the core minilm's model thread is pinned to, in every system

_TEXT = ("the quick brown fox jumps over a lazy dog while seven wizards quietly pack "
         "boxes of liquor jugs near the old harbour where ships unload grain coffee and "
         "steel before dawn every tuesday morning in late autumn")
_WORDS = _TEXT.split()


def sentences(n: int = 256, seed: int = 0) -> list[str]:
    """`n` deterministic sentences of 8–20 words (about 10–26 tokens)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(8, 21)))).capitalize() + "."
            for _ in range(n)]


def _fp32(dim: int) -> Callable[[int], list[np.ndarray]]:
    def payloads(n: int) -> list[np.ndarray]:
        rng = np.random.default_rng(0)
        return list(rng.standard_normal((n, 1, dim), dtype=np.float32))
    return payloads


def _sentences(n: int) -> list[np.ndarray]:
    return [np.array([s.encode()], dtype=object) for s in sentences(n)]


@dataclass(frozen=True, slots=True)
class BenchModel:
    """A model of the comparison: its config and its single-item payloads."""

    config: ModelConfig
    payloads: Callable[[int], list[np.ndarray]]
    pin_core: int | None = None  # pin the thread that runs the model to this core

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def delay_s(self) -> float:
        return self.config.batching.max_queue_delay_s


def _config(name: str, transformer: str, inp: dict, out: dict, delay_s: float,
            num_cpus: float) -> ModelConfig:
    return ModelConfig.model_validate({
        "name": name, "transformer": transformer,
        "inputs": [{"name": "INPUT0", **inp}], "outputs": [{"name": "OUTPUT0", **out}],
        "batching": {"max_batch_size": MAX_BATCH_SIZE, "max_queue_delay_s": delay_s},
        "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": num_cpus,
                     "max_inflight_batches": 2},
    })


def bench_models() -> dict[str, BenchModel]:
    """sleep (2 ms + 0.05 ms/item, no CPU), mlp (256→1024→256, one thread), minilm (one core)."""
    fp32 = {"datatype": "FP32"}
    return {
        "sleep": BenchModel(_config(
            "sleep", "deployments.models:Sleep", {**fp32, "shape": [-1, SLEEP_DIM]},
            {**fp32, "shape": [-1, SLEEP_DIM]}, 0.002, 0.5), _fp32(SLEEP_DIM)),
        "mlp": BenchModel(_config(
            "mlp", "deployments.models:MLP", {**fp32, "shape": [-1, MLP_DIM]},
            {**fp32, "shape": [-1, MLP_DIM]}, 0.002, 0.5), _fp32(MLP_DIM)),
        "minilm": BenchModel(_config(
            "minilm", "deployments.models:MiniLM", {"datatype": "BYTES", "shape": [-1]},
            {**fp32, "shape": [-1, 384]}, 0.005, 0.5), _sentences, pin_core=MODEL_CORE),
    }


def raybatch_config(model: BenchModel, app_name: str, route_prefix: str,
                    variant: str = "actor", native_port: int | None = None) -> dict[str, Any]:
    """The Raybatch config dict of an app serving just `model` (for `load_config`).
    `variant`: a setup's spec (`benchmarks.serve.settings.spec_of`): `actor` or `ingress`
    (`batcher.placement`), then `+idle` for
    `idle_dispatch`, `+access` for Serve's access log (at INFO), `+inproc` for the
    replica in the engine's process (`replicas.in_process`), `+native` for Raybatch's own
    HTTP server on `native_port` (`ingress.native_port`), `+pipe1` for one batch in
    flight per replica (`replicas.max_inflight_batches: 1`), `+fill` for `fill_while_busy`,
    `+leadN` for its `busy_lead_s` of N ms, `+ahead` for `replicas.read_ahead` (replica
    actors read their next batch while they run one; the default for GPU replicas),
    `+raycall` for `batcher.link` and `replicas.link` false (a Ray call per bundle and
    per batch)."""
    placement, *flags = variant.split("+")
    m = model.config.model_dump(mode="json")
    m["batcher"] = {**m.get("batcher", {}), "placement": placement,
                    "link": "raycall" not in flags}
    m["replicas"] = {**m["replicas"], "in_process": "inproc" in flags}
    if "pipe1" in flags:
        m["replicas"]["max_inflight_batches"] = 1
    if "ahead" in flags:
        m["replicas"]["read_ahead"] = True
    m["replicas"]["link"] = "raycall" not in flags
    m["batching"] = {**m["batching"], "idle_dispatch": "idle" in flags,
                     "fill_while_busy": "fill" in flags}
    for flag in flags:
        if flag.startswith("lead"):
            m["batching"]["busy_lead_s"] = int(flag.removeprefix("lead")) / 1e3
    return {"app_name": app_name,
            "ingress": {"num_replicas": 1, "num_cpus": 0.5, "route_prefix": route_prefix,
                        "access_log": "access" in flags,
                        "native_port": native_port if "native" in flags else None},
            "models": [m]}


def pin_current_thread(core: int | None) -> None:
    """Pin the calling thread (Linux: pid 0 is the calling thread) to `core`, if given."""
    if core is not None and core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})


def pin_process(pid: int, core: int) -> None:
    """Pin every thread of process `pid` to `core` (threads it starts later inherit it)."""
    if core >= (os.cpu_count() or 1):
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:  # the thread ended meanwhile
            continue


def ceiling(model: BenchModel, duration_s: float) -> float:
    """Items/s of the model alone, in this process, on full batches of MAX_BATCH_SIZE."""
    if model.name != "minilm":
        from cluster.config import import_object

        rows = [p[0] for p in model.payloads(16)]
        return measure_ceiling(import_object(model.config.transformer), rows,
                               batch_size=MAX_BATCH_SIZE, duration_s=duration_s)
    return offline_encode(duration_s, model.pin_core)


_encoders: dict[str, Any] = {}


def offline_encode(duration_s: float, core: int | None) -> float:
    """Sentences/s of `SentenceTransformer.encode(batch_size=64)` over 256 sentences (it
    sorts them by length, so its batches pad little), one thread pinned to `core`."""
    from deployments.models import MiniLM

    before = os.sched_getaffinity(0)
    pin_current_thread(core)
    try:
        if "minilm" not in _encoders:  # built once: loading the weights is not measured
            m = MiniLM(threads=1)
            m.setup("cpu")
            _encoders["minilm"] = m.model
        encoder = _encoders["minilm"]
        texts = sentences(MAX_BATCH_SIZE * 4)
        encoder.encode(texts[:MAX_BATCH_SIZE], batch_size=MAX_BATCH_SIZE)  # warm
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < duration_s:
            encoder.encode(texts, batch_size=MAX_BATCH_SIZE, convert_to_numpy=True)
            n += len(texts)
        return n / (time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, before)
