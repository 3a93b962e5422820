"""The front's limits as hot-path values, read once from the user's `IngressConfig`.

Each bounds what one client can make one ingress replica hold: header count and
bytes (431), body bytes and the time between its pieces (413, 408), items and
elements of one infer request, checked from the shapes before allocating (413),
open event streams per client address (429), and requests in flight (503), the
last because the fast path bypasses Serve's own `max_ongoing_requests`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.config import IngressConfig
from deployments.protocol import RequestLimits


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_body_bytes: int = 64 * 2**20
    body_timeout_s: float = 30.0
    max_header_count: int = 100
    max_header_bytes: int = 16 * 2**10
    max_items_per_request: int = 65_536
    max_elements_per_request: int = 2**26
    max_streams_per_client: int = 16
    max_inflight_requests: int = 2048

    @classmethod
    def from_config(cls, ingress: IngressConfig) -> HttpLimits:
        """The limits `ingress` sets (see its fields' docs)."""
        return cls(**{name: getattr(ingress, name) for name in cls.__dataclass_fields__})

    @property
    def request(self) -> RequestLimits:
        """What the protocol codec checks while it decodes an infer request."""
        return RequestLimits(self.max_body_bytes, self.max_elements_per_request,
                             self.max_items_per_request)
