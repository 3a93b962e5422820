"""Binary infer requests whose JSON header was seen before, decoded without parsing it.

A client sending one kind of request (tritonclient, a load generator, a service calling
a model) sends the same JSON header every time: the same inputs, datatypes, shapes and
`binary_data_size`s, the same parameters; only the tensor bytes after it change. What
`parse_infer_request` concludes from such a header (every check passed, where each
input's bytes lie) depends only on the header's bytes, the model's `ModelSpec`, the
`RequestLimits` and the length of the binary part. So a header that parsed cleanly is
remembered as a `Plan` on its spec, and the next request with byte-identical header,
limits and binary length is decoded from it: views of the body, as the full parse makes.

Only what cannot change the outcome is remembered: headers up to `MAX_HEADER_BYTES`
whose inputs are all binary and not BYTES (BYTES and JSON `data` depend on the bytes
after the header), with scalar parameters only. A request that does not match a plan
takes the full parse, so every error is the full parse's. Bounded: `MAX_PLANS` headers
per model, forgotten all at once when full (headers are the client's to choose).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.protocol.limits import RequestLimits

MAX_HEADER_BYTES = 4096
MAX_PLANS = 256
_SCALARS = (bool, int, float, str, type(None))


@dataclass(frozen=True, slots=True)
class Plan:
    """How to decode a request whose JSON header is the one this plan was made from."""

    limits: RequestLimits
    binary_size: int  # the bytes after the header, exactly
    inputs: tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]  # name, dtype,
    # shape, where its bytes start after the header, and its element count
    request_id: str | None
    parameters: dict[str, Any]
    outputs: list[Any]
    batch_size: int | None

    def inputs_of(self, binary: memoryview) -> dict[str, np.ndarray]:
        """The inputs, as read-only views of `binary` (what `decode_binary` returns)."""
        return {name: np.frombuffer(binary, dtype, count, start).reshape(shape)
                for name, dtype, shape, start, count in self.inputs}


def make_plan(doc: dict[str, Any], inputs: dict[str, np.ndarray], binary_size: int,
              limits: RequestLimits, request: Any) -> Plan | None:
    """The plan of a request that parsed cleanly (`doc`: its JSON header; `inputs`: what
    it decoded to), or None when its outcome depends on more than the header."""
    if any(type(v) not in _SCALARS for v in request.parameters.values()):
        return None
    placed = []
    offset = 0
    for entry in doc["inputs"]:
        params = entry.get("parameters") or {}
        if "binary_data_size" not in params or entry["datatype"] == "BYTES":
            return None
        name, size = entry["name"], params["binary_data_size"]
        array = inputs[name]
        placed.append((name, array.dtype, array.shape, offset, array.size))
        offset += size
    return Plan(limits, binary_size, tuple(placed), request.id, dict(request.parameters),
                list(request.outputs_requested), request.batch_size)


def remember(plans: dict[bytes, Plan], header: bytes, plan: Plan | None) -> None:
    if plan is None:
        return
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[header] = plan
