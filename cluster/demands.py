"""What Ray holds queued for want of resources, read from the GCS.

Ray takes an actor's resources before it starts the actor's process, so an actor without
a process yet is either queued (no node has what it asks free: an autoscaler's cue, and
a user's problem where none runs) or merely starting (its resources are held, its worker
process is still importing). Only Ray's list of waiting demands, what `ray status` prints
as demands, tells the two apart; `raybatch up`'s deploy view and a replica pool's warning
both read it here.
"""

from __future__ import annotations

from collections.abc import Mapping


def bundle_key(resources: Mapping[str, float]) -> tuple:
    """A resource bundle as a key: its resources but memory, each once, sorted."""
    return tuple(sorted((k, float(v)) for k, v in resources.items() if v and k != "memory"))


def waiting_demands() -> dict[tuple, int] | None:
    """The resource bundles Ray's nodes hold queued because no node has them free (what
    `ray status` lists as demands), with how many of each; None where Ray does not say.
    A blocking call to the GCS (at most 2 s): off an event loop's thread."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address, timeout=2)
        out: dict[tuple, int] = {}
        for demand in status.resource_demands.ray_task_actor_demand:
            for by_count in demand.bundles_by_count:
                key = bundle_key(by_count.bundle)
                out[key] = out.get(key, 0) + by_count.count
        return out
    except Exception:  # a view of Ray's state, best effort: the caller says what it can
        return None


def queued_for(asks: Mapping[str, float], waiting: Mapping[tuple, int] | None) -> bool:
    """Whether a bundle asking at least `asks` (the asker may add resources of its own, a
    NUMA node's or a node's) is among `waiting`; True where Ray did not say (None)."""
    if waiting is None:
        return True
    wanted = set(bundle_key(asks))
    return any(count > 0 and wanted <= set(key) for key, count in waiting.items())
