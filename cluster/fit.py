"""Whether a config's minimum can run on a cluster, checked before it is deployed.

Ray waits forever for an actor whose resources no node has, and Serve reports only that
a replica is slow to start; a config that cannot fit would hang `raybatch up` in
silence. So the minimum demand (what must be placed before the app serves: the ingress
replicas, the batching actors, `min_replicas` replica actors of every model, each
ingress replica's share where its engine owns them) is summed per resource and compared
with the cluster's totals, and each actor with the largest node. What does not fit is
refused with the arithmetic and the fix; a cluster that can grow (an autoscaler) is
told what it is waiting for instead (`Demand.shortfall`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster.config import ConfigError, RaybatchConfig


@dataclass(frozen=True)
class Need:
    what: str
    """Who asks, as a user would name it ('mlp replica', 'ingress replica')."""
    count: int
    each: dict[str, float]


def minimum_demand(config: RaybatchConfig) -> list[Need]:
    """What must be placed for `config` to serve: (who, how many, resources each)."""
    n = config.ingress.num_replicas
    needs = [Need("ingress replica", n, {"CPU": config.ingress_num_cpus})]
    for m in config.models:
        r = m.replicas
        if m.batcher.placement == "actor" and m.batcher_num_cpus:
            needs.append(Need(f"{m.name} batching actor", m.batcher.shards,
                              {"CPU": m.batcher_num_cpus}))
        if r.in_process or not r.min_replicas:
            continue  # in-process replicas are counted in their host's CPUs
        count = r.min_replicas if m.batcher.placement == "actor" else n * -(-r.min_replicas // n)
        needs.append(Need(f"{m.name} replica", count,
                          {"CPU": r.num_cpus, "GPU": r.num_gpus, **r.resources}))
    return [Need(x.what, x.count, {k: v for k, v in x.each.items() if v}) for x in needs]


def shortfall(needs: Iterable[Need], nodes: list[dict[str, float]]) -> list[str]:
    """Each way `needs` cannot fit `nodes` (their total resources), with the arithmetic;
    empty if it fits by these counts (Ray may still split it badly across nodes)."""
    needs = list(needs)
    problems = []
    for key in sorted({k for x in needs for k in x.each}):
        terms = [x for x in needs if x.each.get(key)]
        want = sum(x.count * x.each[key] for x in terms)
        have = sum(node.get(key, 0.0) for node in nodes)
        if want > have + 1e-9:
            sums = " + ".join(f"{x.count} {x.what}{'s' if x.count > 1 else ''} x "
                              f"{x.each[key]:g}" for x in terms)
            problems.append(f"{key}: {sums} = {want:g}, the cluster has {have:g}")
    biggest = {k: max((node.get(k, 0.0) for node in nodes), default=0.0)
               for x in needs for k in x.each}
    for x in needs:
        if not problems and not any(all(node.get(k, 0.0) + 1e-9 >= v
                                        for k, v in x.each.items()) for node in nodes):
            problems.append(f"one {x.what} asks {_fmt(x.each)}; no node has that much "
                            f"(the largest has {_fmt(biggest)})")
    return problems


def check_fit(config: RaybatchConfig, nodes: list[dict[str, float]]) -> None:
    """Raise ConfigError, saying what to change, if `config`'s minimum cannot fit."""
    problems = shortfall(minimum_demand(config), nodes)
    if problems:
        raise ConfigError(refusal(problems))


def refusal(problems: list[str]) -> str:
    """What `shortfall` found, and how to fix it."""
    return ("the app's minimum does not fit this cluster:\n  " + "\n  ".join(problems) +
            "\nlower replicas.min_replicas, num_cpus or num_gpus (or ingress.num_replicas, "
            "ingress.num_cpus), or give Ray more (`raybatch up --num-cpus N`; GPUs it finds "
            "itself), or join a cluster that has them (`raybatch up --address`)")


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))
