"""The ingress wing: what runs in a Serve ingress replica (and in a `RaybatchClient`
caller's process) on a request's way to its engine. See `deployments` for the map."""

from deployments.ingress.client import RaybatchClient

__all__ = ["RaybatchClient"]
