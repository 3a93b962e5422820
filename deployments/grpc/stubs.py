"""tritonclient's generated stubs, made picklable, and the servicer adder Serve registers.

`tritonclient.grpc.service_pb2` builds its message classes under the module name
`grpc_service_pb2` (and `model_config_pb2`), which no import finds. Ray pickles
each request proto from Serve's proxy to the ingress replica by class reference,
so both processes must find those names: importing this module registers the
aliases. Serve's proxy imports it through `add_servicer`, the function named in
`grpc_options.grpc_servicer_functions`, which then registers the service with
tritonclient's own `add_GRPCInferenceServiceServicer_to_server`.
"""

from __future__ import annotations

import sys
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

sys.modules.setdefault("grpc_service_pb2", service_pb2)
sys.modules.setdefault("model_config_pb2", model_config_pb2)

# What Serve's gRPC proxy registers (grpc_options.grpc_servicer_functions).
SERVICER_FUNCTIONS = ["deployments.grpc.stubs.add_servicer"]


def add_servicer(servicer: Any, server: Any) -> None:
    """Register the GRPCInferenceService on `server` (tritonclient's generated adder)."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
