"""Render what Ray deploys from a `RaybatchConfig`: the Serve config file.

`serve build deployments.app:app` writes a file that re-imports the app and so
depends on `RAYBATCH_CONFIG` being set the same way wherever it is deployed.
`serve_config` instead puts the whole Raybatch config inline, as the `args` of
the `deployments.app:app_builder` application builder, together with the
config's app name, route prefix, host and port: one self-contained file for
`serve deploy` or a RayService's `serveConfigV2`.
"""

from __future__ import annotations

from typing import Any

import yaml

from cluster.config import RaybatchConfig

APP_BUILDER = "deployments.app:app_builder"
# The KServe v2 / Triton gRPC service (deployments.grpc.SERVICER_FUNCTIONS; named here
# because cluster/ does not import deployments/).
GRPC_SERVICER = "deployments.grpc.stubs.add_servicer"


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
        }],
    }


def serve_config_yaml(config: RaybatchConfig) -> str:
    return yaml.safe_dump(serve_config(config), sort_keys=False)
