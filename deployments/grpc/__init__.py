"""The KServe v2 / Triton `GRPCInferenceService`, served through Ray Serve's gRPC proxy.

Serve's proxy owns the port and the HTTP/2 server; it registers the service with
the servicer adder of `tritonclient`'s generated stubs and forwards each call to
the ingress method of the same name (`ModelInfer`, `ModelStreamInfer`, ...),
picking the application by the `application` metadata key (or the only one).
What a call means is here:

    codec.py     ModelInferRequest -> arrays and parameters (raw_input_contents or typed
                 contents), outputs -> ModelInferResponse (raw_output_contents)
    messages.py  health, server and model metadata, model config, statistics as protos
    status.py    Raybatch's errors -> gRPC status codes, in one table
    servicer.py  GrpcServicer (one coroutine per RPC over the ingress's models) and
                 GrpcIngress, the methods Serve's proxy calls on the ingress
    stream.py    ModelStreamInfer's call: every request of the stream at once, an error
                 response per failed one, everything cancelled when the client hangs up
    generate.py  a generation on the stream: the request (text_input, parameters as
                 Triton's vLLM / TensorRT-LLM backends take them), a response per step
    stubs.py     tritonclient's generated stubs made picklable; the servicer adder that
                 Serve's proxy registers

No HTTP; the same `ModelRoute` serves HTTP, gRPC and handle calls.
"""

from deployments.grpc.servicer import GrpcIngress, GrpcServicer
from deployments.grpc.stubs import SERVICER_FUNCTIONS

__all__ = ["SERVICER_FUNCTIONS", "GrpcIngress", "GrpcServicer"]
