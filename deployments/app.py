"""The Serve application, built from a `RaybatchConfig`.

`serve run deployments.app:app` deploys the config named by the environment
variable `RAYBATCH_CONFIG` (default: the bundled demo). Each model gets a
batching actor declared as a deployment-scoped actor of the ingress, so Serve
owns its lifecycle: deleting the app (or `serve shutdown`) stops the batching
actors, and with them the replica actors they own. A model with
`batcher.placement: ingress` has no batching actor: each ingress replica runs
its engine and owns its replicas (`deployments.backends`).
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.config import DeploymentActorConfig

from cluster.config import RaybatchConfig, load_default
from cluster.modelpath import python_path_env
from cluster.render import logging_config
from deployments.backends import batcher_actor_name
from deployments.batcher import BatcherActor
from deployments.http import REPLICA_ENV
from deployments.ingress import Ingress


def build_app(config: RaybatchConfig) -> serve.Application:
    # The config's python_path reaches every process that imports a model class.
    env = {"runtime_env": {"env_vars": python_path_env(config.python_path)}} \
        if config.python_path else {}
    actors = [
        DeploymentActorConfig(
            name=batcher_actor_name(m.name, shard),
            actor_class=BatcherActor,
            init_kwargs={"model_json": m.model_dump_json(), "shard": shard,
                         "metrics_json": config.metrics.model_dump_json()},
            actor_options={"num_cpus": m.batcher_num_cpus, "max_concurrency": 10_000, **env},
        )
        for m in config.models if m.batcher.placement == "actor"  # else: in the ingress
        for shard in range(m.batcher.shards)
    ]
    drain_s = config.ingress.drain_timeout_s
    deployment = Ingress.options(
        num_replicas=config.ingress.num_replicas,
        # REPLICA_ENV: the HTTP fast path, when the cluster runs Serve's direct ingress
        ray_actor_options={"num_cpus": config.ingress_num_cpus,
                           "runtime_env": {"env_vars": {
                               **REPLICA_ENV, **python_path_env(config.python_path)}}},
        deployment_actors=actors,
        # Serve force-kills a stopping replica this long after asking it to stop: room
        # for its own requests to finish, then for the batching actors' drain (its
        # __del__, deployments.drain). Checked 4x a second, not every 2 s.
        graceful_shutdown_timeout_s=2 * drain_s + 5,
        graceful_shutdown_wait_loop_s=0.25,
        logging_config=logging_config(config),  # WARNING: no access-log record per request
    )
    return deployment.bind(config.model_dump_json())


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For `serve run deployments.app:app_builder config=FILE`, and for the files
    `raybatch build` renders, whose `args.config` holds the whole config inline."""
    return build_app(load_default(args.get("config")))


app = build_app(load_default())
