"""The Serve application, built from a `RaybatchConfig`.

`serve run deployments.app:app` deploys the config named by the environment
variable `RAYBATCH_CONFIG` (default: the bundled demo). Each model (or each
`batcher.group` of models) gets a batching actor declared as a deployment-scoped
actor of the ingress, so Serve
owns its lifecycle: deleting the app (or `serve shutdown`) stops the batching
actors, and with them the replica actors they own. A model with
`batcher.placement: ingress` has no batching actor: each ingress replica runs
its engine and owns its replicas (`deployments.ingress.placement`).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.config import DeploymentActorConfig

from cluster.config import ModelConfig, RaybatchConfig, load_default
from cluster.modelpath import python_path_env
from cluster.render import logging_config
from cluster.spread import actor_placement
from deployments.batcher.actor import BatcherActor
from deployments.http import REPLICA_ENV
from deployments.ingress.deployment import Ingress
from deployments.ingress.placement import batcher_actor_name


def build_app(config: RaybatchConfig) -> serve.Application:
    # The config's python_path reaches every process that imports a model class.
    env = {"runtime_env": {"env_vars": python_path_env(config.python_path)}} \
        if config.python_path else {}
    actors = [
        DeploymentActorConfig(
            name=batcher_actor_name(first.name, shard, first.batcher.group),
            actor_class=BatcherActor,
            init_kwargs={"model_json": first.model_dump_json(), "shard": shard,
                         "metrics_json": config.metrics.model_dump_json(),
                         **({"group_json": [m.model_dump_json() for m in more]} if more else {})},
            # the models of a group agree on where it runs (config: group_placement_agrees)
            actor_options={"num_cpus": sum(m.batcher_num_cpus for m in (first, *more)),
                           "max_concurrency": 10_000, **env,
                           **actor_placement(first.batcher.resources, first.batcher.labels)},
        )
        for first, *more in batching_actors(config)
        for shard in range(first.batcher.shards)
    ]
    drain_s = config.ingress.drain_timeout_s
    deployment = Ingress.options(
        num_replicas=config.ingress.num_replicas,
        # REPLICA_ENV: the HTTP fast path, when the cluster runs Serve's direct ingress
        ray_actor_options={"num_cpus": config.ingress_num_cpus,
                           "runtime_env": {"env_vars": {
                               **REPLICA_ENV, **python_path_env(config.python_path)}},
                           **actor_placement(config.ingress.resources, config.ingress.labels)},
        deployment_actors=actors,
        # Serve force-kills a stopping replica this long after asking it to stop: room
        # for its own requests to finish, then for the batching actors' drain (its
        # __del__, deployments.ingress.drain). Checked 4x a second, not every 2 s.
        graceful_shutdown_timeout_s=2 * drain_s + 5,
        graceful_shutdown_wait_loop_s=0.25,
        logging_config=logging_config(config),  # WARNING: no access-log record per request
    )
    return deployment.bind(config.model_dump_json())


def batching_actors(config: RaybatchConfig) -> list[list[ModelConfig]]:
    """The models of each batching actor: one each, or a `batcher.group`'s together (in
    the config's order); none for a model whose engine runs in the ingress."""
    groups: dict[str, list[ModelConfig]] = {}
    out: list[list[ModelConfig]] = []
    for m in config.models:
        if m.batcher.placement != "actor":
            continue
        if m.batcher.group is None:
            out.append([m])
        elif m.batcher.group not in groups:
            groups[m.batcher.group] = [m]
            out.append(groups[m.batcher.group])
        else:
            groups[m.batcher.group].append(m)
    return out


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For `serve run deployments.app:app_builder config=FILE`, and for the files
    `raybatch build` renders, whose `args.config` holds the whole config inline."""
    return build_app(load_default(args.get("config")))


app = build_app(load_default())
