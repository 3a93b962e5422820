"""Render what Ray deploys from a `RaybatchConfig`: the Serve config file.

`serve build deployments.app:app` writes a file that re-imports the app and so
depends on `RAYBATCH_CONFIG` being set the same way wherever it is deployed.
`serve_config` instead puts the whole Raybatch config inline, as the `args` of
the `deployments.app:app_builder` application builder, together with the
config's app name, route prefix, host and port: one self-contained file for
`serve deploy` or a RayService's `serveConfigV2`.

Serve's fastest switches (`serve_environment`, measured in the docs' cluster page) are read
once, when each Serve process imports Ray Serve: the controller (direct ingress,
HAProxy, which proxies to start), the proxy, and every replica (throughput mode:
user code on the replica's event loop, gRPC handles; direct ingress: the replica's
own HTTP server). A Serve config file can carry environment variables only to its
applications' replicas (`runtime_env.env_vars`), never to the controller, so they
belong in the environment of every Ray node: `raybatch up` and `raybatch join`
set them; on Kubernetes, the head and worker containers' `env`; with `serve
deploy`, whatever starts the nodes. `raybatch build` names them in the file's
header. What a config file does carry is the app's `logging_config` (log level
WARNING, no access log).
"""

from __future__ import annotations

from typing import Any

import yaml

from cluster.config import RaybatchConfig

APP_BUILDER = "deployments.app:app_builder"
# The KServe v2 / Triton gRPC service (deployments.grpc.SERVICER_FUNCTIONS; named here
# because cluster/ does not import deployments/).
GRPC_SERVICER = "deployments.grpc.stubs.add_servicer"
PROXY_READY_CHECK_TIMEOUT_S = "30"
"""Seconds Serve's controller gives a starting proxy (Serve's default: 5; each restart
waits one more such step)."""


def serve_environment(config: RaybatchConfig) -> dict[str, str]:
    """The environment every Ray node (hence the Serve controller, proxies and replicas)
    needs for Serve's fastest configuration: throughput mode, which also turns direct
    ingress on (ingress replicas serve HTTP on their own ports), and HAProxy on the HTTP
    port in front of them when `ingress.haproxy`. Plus a ready check that a busy node
    passes: a proxy (with its HAProxy) that takes more than Serve's 5 s to start, as it
    does beside replicas loading their models, is otherwise killed and started again."""
    env = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": PROXY_READY_CHECK_TIMEOUT_S}
    if config.ingress.haproxy:
        env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    return env


def logging_config(config: RaybatchConfig) -> dict[str, Any]:
    """The app's Serve logging config: WARNING skips the per-request access-log record."""
    level = config.ingress.log_level
    if config.ingress.access_log and level not in ("DEBUG", "INFO"):
        level = "INFO"  # access-log lines are INFO records
    return {"log_level": level, "enable_access_log": config.ingress.access_log}


def serve_config(config: RaybatchConfig) -> dict[str, Any]:
    """A Serve deploy config (what `ray.serve.schema.ServeDeploySchema` validates)."""
    grpc = ({"grpc_options": {"port": config.ingress.grpc_port,
                              "grpc_servicer_functions": [GRPC_SERVICER]}}
            if config.ingress.grpc_port else {})
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": config.ingress.host, "port": config.ingress.port},
        **grpc,
        "applications": [{
            "name": config.app_name,
            "route_prefix": config.ingress.route_prefix,
            "import_path": APP_BUILDER,
            "args": {"config": config.model_dump(mode="json")},
            "logging_config": logging_config(config),
        }],
    }


def serve_config_yaml(config: RaybatchConfig) -> str:
    """The Serve config as YAML, headed by the node environment it was measured with."""
    env = " ".join(f"{k}={v}" for k, v in serve_environment(config).items())
    header = ("# Serve's fastest settings are read by the controller and the replicas when they\n"
              "# start, not from this file: start every Ray node with them in its environment\n"
              f"# (raybatch up / join do; RayService: the containers' env):\n#   {env}\n")
    return header + yaml.safe_dump(serve_config(config), sort_keys=False)
