"""How many pods of each worker group the models need: the autoscaler's min and max.

Each actor the app starts asks Ray for something: the ingress replicas and the
batching actors for CPUs, each model replica for CPUs, GPUs and (pinned, whole
cores) `numa<N>` cores, as `deployments/replica/pool.py` asks through `cluster.raynode`.
A model goes to the first worker group one of its replicas fits in (the GPU group
for a model with GPUs); the ingress and the batching actors to the first CPU group.
A group's `minReplicas` is the pods that hold every model at `min_replicas` (the
pool starts at least one), its `maxReplicas` the pods that hold every model at
`max_replicas`, both packed first-fit-decreasing the way Ray fills nodes (CPUs,
GPUs, and each replica's cores on one NUMA node of the pod). The autoscaler
moves between the two; nothing can ask for more.

A replica that fits no group is an error naming the model, the value and the fix:
the manifests would otherwise deploy a replica that stays pending forever.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster.config import ConfigError, ModelConfig, RaybatchConfig
from cluster.k8s.settings import CpuWorkers, GpuWorkers, KubernetesConfig
from cluster.pinning import pinned_cores
from cluster.raynode import numa_amounts

MAX_PODS = 2**31 - 1  # KubeRay's maxReplicas is an int32


class RenderError(ConfigError):
    """The config cannot be deployed on the pods described: the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class Ask:
    """What one actor asks of a pod."""

    cpus: float
    cores: int = 0
    """Physical cores of one NUMA node (its `numa<N>` resource); 0: not pinned."""
    gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class Demand:
    """`count_min`..`count_max` actors of one kind, each asking `ask`."""

    what: str
    ask: Ask
    count_min: int
    count_max: int


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One worker group: its settings, kind, what goes there, and its pod bounds."""

    workers: CpuWorkers | GpuWorkers
    gpu: bool
    demands: tuple[Demand, ...]
    min_pods: int
    max_pods: int


def replica_ask(model: ModelConfig) -> Ask:
    """What one replica of `model` asks Ray for (see `cluster.raynode.numa_request`)."""
    r = model.replicas
    named = numa_amounts(r.resources)
    if named:
        cores = math.ceil(max(named.values()))
    elif r.pin == "off" or r.num_gpus:
        cores = 0
    else:
        cores = pinned_cores(r.num_cpus)
    return Ask(cpus=r.num_cpus, cores=cores, gpus=r.num_gpus)


def _model_demands(model: ModelConfig) -> tuple[Demand | None, Demand | None]:
    """Its replica actors' demand (None when in process: the host asks for them) and its
    batching actors' (with what their in-process replicas reserve; None when none)."""
    r = model.replicas
    replica = None if r.in_process else Demand(f"model {model.name!r} replica",
                                               replica_ask(model), max(1, r.min_replicas),
                                               r.max_replicas)
    batcher = None
    if model.batcher.placement == "actor" and model.batcher_num_cpus:
        batcher = Demand(f"model {model.name!r} batching actor",
                         Ask(cpus=model.batcher_num_cpus), model.batcher.shards,
                         model.batcher.shards)
    return replica, batcher


def fits(ask: Ask, workers: CpuWorkers | GpuWorkers) -> bool:
    gpus = getattr(workers, "gpus", 0)
    return (ask.cpus <= workers.cpus and ask.gpus <= gpus
            and ask.cores <= workers.cores_per_numa_node)


def pods_needed(asks: Iterable[Ask] | Mapping[Ask, int],
                workers: CpuWorkers | GpuWorkers) -> int:
    """Pods of `workers` that hold every ask (each fits one), packed first-fit decreasing:
    each ask, the largest first, goes to the first pod with room for it, else to a new pod.
    `asks`: the asks one by one, or each distinct ask with its count. Pods in the same state
    are kept as one run with a count, and a run of identical asks is placed a run at a
    time, so the work grows with the distinct asks, not with the counts (a model with
    max_replicas in the millions packs as fast as one with two), with the same result as
    placing each ask in turn."""
    counts: dict[Ask, int] = {}
    for ask, n in (asks.items() if isinstance(asks, Mapping) else ((a, 1) for a in asks)):
        counts[ask] = counts.get(ask, 0) + n
    empty = (float(workers.cpus), float(getattr(workers, "gpus", 0)),
             *[float(workers.cores_per_numa_node)] * workers.numa_nodes)
    runs: list[list] = []  # [pod state, how many pods in a row are in it], in pod order
    for ask in sorted(counts, key=lambda a: (a.gpus, a.cores, a.cpus), reverse=True):
        left, i = counts[ask], 0
        while left and i < len(runs):
            state, count = runs[i]
            room = _room(state, ask)
            if room == 0:
                i += 1
                continue
            # the run's first `full` pods fill up; the next takes what is left, if less
            full = 1 if room is None else min(count, left // room)
            each = left if room is None else room
            last = 0 if room is None or full == count else left - full * room
            parts = ([[_placed(state, ask, each), full]] if full else []) + (
                [[_placed(state, ask, last), 1]] if last else [])
            rest = count - full - (1 if last else 0)
            runs[i:i + 1] = parts + ([[state, rest]] if rest else [])
            left -= full * each + last
            i += len(parts)
        if left:  # new pods, each holding what an empty one can (at least one: each fits)
            room = _room(empty, ask)
            room = left if room is None else max(room, 1)
            full, last = divmod(left, room)
            runs += ([[_placed(empty, ask, room), full]] if full else []) + (
                [[_placed(empty, ask, last), 1]] if last else [])
    return sum(count for _, count in runs)


def _room(state: tuple[float, ...], ask: Ask) -> int | None:
    """How many of `ask` one pod in `state` still takes (None: any number, it asks nothing)."""
    limits = []
    for free, want in ((state[0], ask.cpus), (state[1], ask.gpus)):
        if want > 0:
            limits.append(max(0, math.floor((free + 1e-9) / want)))
    if ask.cores:
        limits.append(sum(int(free) // ask.cores for free in state[2:]))
    return min(limits) if limits else None


def _placed(state: tuple[float, ...], ask: Ask, n: int) -> tuple[float, ...]:
    """`state` with `n` of `ask` taken, each one's cores from the first NUMA node with
    room for them (as placing them one by one does)."""
    nodes = list(state[2:])
    if ask.cores:
        left = n
        for k, free in enumerate(nodes):
            take = min(left, int(free) // ask.cores)
            nodes[k] -= take * ask.cores
            left -= take
    return (state[0] - n * ask.cpus, state[1] - n * ask.gpus, *nodes)


def plan_groups(config: RaybatchConfig, k8s: KubernetesConfig) -> list[GroupPlan]:
    """The worker groups to render, CPU groups first, each with its pod bounds."""
    cpu: dict[str, list[Demand]] = {g.name: [] for g in k8s.cpu_workers}
    gpu: list[Demand] = []
    first = k8s.cpu_workers[0]
    ingress = config.ingress
    _check_advertised("ingress.resources", ingress.resources)
    if config.ingress_num_cpus:
        demand = Demand("the ingress", Ask(cpus=config.ingress_num_cpus), ingress.num_replicas,
                        ingress.num_replicas)
        if not fits(demand.ask, first):
            field = "ingress.num_cpus" if config.ingress_num_cpus == ingress.num_cpus else \
                "ingress.num_cpus, with its in-process replicas' num_cpus"
            raise RenderError(_too_big(demand, [first], field))
        cpu[first.name].append(demand)
    for model in config.models:
        _check_resources(model)
        replica, batcher = _model_demands(model)
        if batcher is not None:
            if not fits(batcher.ask, first):
                raise RenderError(_too_big(batcher, [first], "batcher.num_cpus"))
            cpu[first.name].append(batcher)
        if replica is None:
            continue
        if replica.ask.gpus:
            gpu.append(_check_gpu(model, replica, k8s.gpu_workers))
            continue
        group = next((g for g in k8s.cpu_workers if fits(replica.ask, g)), None)
        if group is None:
            raise RenderError(_too_big(replica, k8s.cpu_workers, "replicas.num_cpus"))
        cpu[group.name].append(replica)
    plans = [_plan(g, False, cpu[g.name]) for g in k8s.cpu_workers if cpu[g.name]]
    if gpu and k8s.gpu_workers is not None:
        plans.append(_plan(k8s.gpu_workers, True, gpu))
    return plans


def _plan(workers: CpuWorkers | GpuWorkers, gpu: bool, demands: Sequence[Demand]) -> GroupPlan:
    def asks(which: str) -> dict[Ask, int]:
        counts: dict[Ask, int] = {}
        for d in demands:
            counts[d.ask] = counts.get(d.ask, 0) + getattr(d, which)
        return counts

    plan = GroupPlan(workers, gpu, tuple(demands), pods_needed(asks("count_min"), workers),
                     pods_needed(asks("count_max"), workers))
    if plan.max_pods > MAX_PODS:
        most = max(demands, key=lambda d: d.count_max)
        raise RenderError(
            f"worker group {workers.name!r} would need {plan.max_pods:,} pods to hold every "
            f"replica at its most ({most.what}: {most.count_max:,}), more than a RayCluster "
            f"worker group's maxReplicas can say ({MAX_PODS:,}): lower max_replicas, or "
            "make the pods bigger under kubernetes.")
    return plan


def _check_resources(model: ModelConfig) -> None:
    for field, asked in (("replicas.resources", model.replicas.resources),
                         ("batcher.resources", model.batcher.resources)):
        _check_advertised(f"model {model.name!r}: {field}", asked)


def _check_advertised(what: str, resources: Mapping[str, float]) -> None:
    """Custom resources (`replicas`, `batcher`, `ingress`): the rendered pods advertise
    numa<N> only, so anything else would stay pending forever."""
    other = sorted(k for k in resources if k not in
                   {f"numa{n}" for n in numa_amounts(resources)})
    if other:
        raise RenderError(f"{what} names {other}, which no rendered worker group "
                          f"advertises (they advertise numa<N> only): remove it, or what "
                          f"asks for it stays pending forever")


def _check_gpu(model: ModelConfig, replica: Demand, gpus: GpuWorkers | None) -> Demand:
    r = model.replicas
    if gpus is None:
        raise RenderError(f"model {model.name!r} asks replicas.num_gpus={r.num_gpus:g} but "
                          f"kubernetes.gpu_workers is null: describe the GPU pods there, or "
                          f"set num_gpus to 0")
    if replica.ask.cores:
        raise RenderError(f"model {model.name!r} asks for GPUs and numa<N> cores "
                          f"(replicas.resources={dict(r.resources)}), but GPU pods advertise "
                          f"no numa<N> (GPU replicas pin to their GPU's cores): drop the numa "
                          f"resources")
    if not fits(replica.ask, gpus):
        raise RenderError(_too_big(replica, [gpus], "replicas"))
    return replica


def _too_big(demand: Demand, groups: Sequence[CpuWorkers | GpuWorkers], field: str) -> str:
    ask = demand.ask
    wanted = [f"{ask.cpus:g} CPUs"] + ([f"{ask.gpus:g} GPUs"] if ask.gpus else []) + (
        [f"{ask.cores} cores of one NUMA node"] if ask.cores else [])
    have = "; ".join(
        f"{g.name}: {g.cpus} CPUs"
        + (f", {g.gpus} GPUs" if isinstance(g, GpuWorkers) else "")
        + f", {g.cores_per_numa_node} cores per NUMA node" for g in groups)
    return (f"{demand.what} asks {', '.join(wanted)} ({field}), more than any worker pod has "
            f"({have}): lower {field}, or make the pods bigger under kubernetes.")
