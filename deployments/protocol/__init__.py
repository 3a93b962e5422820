"""The Open Inference Protocol (KServe v2, what Triton speaks), as a codec: no HTTP, no Ray.

The ingress moves bytes and headers; everything a body means is decided here.

    datatypes.py  OIP datatype strings <-> numpy dtypes
    metadata.py   ModelSpec / TensorSpec, model metadata and config, server metadata,
                  the statistics extension's JSON
    stats.py      a model's counters merged across its engine's shards, in the statistics
                  extension's shape (HTTP and gRPC alike)
    jsondata.py   tensor data as JSON `data` lists, strictly, both ways (orjson, numpy)
    binary.py     the binary tensor extension, and a request's inputs checked against the
                  model's tensors and the request limits
    request.py    an infer request's body and headers -> arrays and parameters; strict JSON
    response.py   outputs -> a response body (in parts, for zero-copy) and headers; the
                  error body
    generate.py   the generate extension: request bodies, responses, SSE events
    limits.py     RequestLimits (what one request may carry); `shown`, a bounded repr

Everything wrong with a request raises `InvalidRequest` (or `PayloadTooLarge`) with a
message that says what was wrong and how to fix it.
"""

from deployments.protocol.binary import INFER_HEADER_LENGTH, PayloadTooLarge, encode_binary
from deployments.protocol.datatypes import NUMPY_DTYPES, check_datatype, datatype_of
from deployments.protocol.generate import generate_response, parse_generate_body, sse_event
from deployments.protocol.limits import RequestLimits, shown
from deployments.protocol.metadata import (
    DEFAULT_EXTENSIONS,
    BatchStats,
    DurationStat,
    ModelCounters,
    ModelSpec,
    TensorSpec,
    metadata_json,
    model_config_json,
    model_stat_json,
    package_version,
    read_index_request,
    repository_index_json,
    served_extensions,
    server_metadata_json,
    stats_json,
)
from deployments.protocol.request import (
    InferRequest,
    LowerHeaders,
    RequestedOutput,
    check_content_length,
    load_json,
    parse_infer_request,
)
from deployments.protocol.response import encode_infer_raw, encode_infer_response, error_body

__all__ = [
    "DEFAULT_EXTENSIONS",
    "INFER_HEADER_LENGTH",
    "NUMPY_DTYPES",
    "BatchStats",
    "DurationStat",
    "InferRequest",
    "LowerHeaders",
    "ModelCounters",
    "ModelSpec",
    "PayloadTooLarge",
    "RequestLimits",
    "RequestedOutput",
    "TensorSpec",
    "check_content_length",
    "check_datatype",
    "datatype_of",
    "encode_binary",
    "encode_infer_raw",
    "encode_infer_response",
    "error_body",
    "generate_response",
    "load_json",
    "metadata_json",
    "model_config_json",
    "model_stat_json",
    "package_version",
    "parse_generate_body",
    "parse_infer_request",
    "read_index_request",
    "repository_index_json",
    "served_extensions",
    "server_metadata_json",
    "shown",
    "sse_event",
    "stats_json",
]
