"""Raybatch's errors as gRPC status codes: one table, from the HTTP status each error has.

Every error class already carries its HTTP status (`batching.errors`); gRPC gets
the code that means the same to a gRPC client, so both protocols agree on what
went wrong: bad input is INVALID_ARGUMENT, an unknown model NOT_FOUND, a full
queue or an oversized request RESOURCE_EXHAUSTED (retry later, or send less), a
model that is not ready or lost its worker UNAVAILABLE (retry), a deadline that
passed DEADLINE_EXCEEDED. Anything unexpected is INTERNAL and logged.
"""

from __future__ import annotations

import grpc

from batching.errors import RaybatchError, http_status

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    410: grpc.StatusCode.FAILED_PRECONDITION,  # the sequence's state is gone: start it again
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and details a call that ended with `error` returns."""
    code = CODES.get(http_status(error), grpc.StatusCode.INTERNAL)
    message = str(error) or type(error).__name__
    if not isinstance(error, RaybatchError):
        message = f"{type(error).__name__}: {message}"
    return code, message
