"""The HTTP front's own errors, and the one place any error becomes a response.

Every answer that is not a success has the protocol's shape, `{"error": "..."}`,
routing errors included (on the OpenAI routes, OpenAI's: `{"error": {"message", "type",
"param", "code"}}`), with the status from the exception's class
(`batching.errors.http_status`). What the body may say is decided here: a
`RaybatchError` says what was wrong and how to fix it; anything else is a fault
of the server or of the model and says only its type (and the model's one-line
message), never a traceback, a note or a path. A client's mistake is logged as
one line; only an error the server did not mean to raise logs its traceback, so
a hostile client cannot flood the log.
"""

from __future__ import annotations

import logging
import math

import orjson

from batching.errors import InvalidRequest, RaybatchError, http_status
from deployments.protocol import error_body
from deployments.protocol.limits import shown
from deployments.protocol.openai import error_doc

log = logging.getLogger("deployments.http")

MAX_MESSAGE_CHARS = 2_000
_MODEL_NOTE = "in the model worker"  # what batching.errors.portable notes on model errors


class UnknownModel(RaybatchError):
    """No model of that name (or version) is served here."""

    http_status = 404


class NoRoute(InvalidRequest):
    """No route has this path."""

    http_status = 404


class MethodNotAllowed(InvalidRequest):
    """The path exists, but not for this method; `allow` lists the methods it takes."""

    http_status = 405

    def __init__(self, message: str, allow: tuple[str, ...], template: str) -> None:
        super().__init__(message)
        self.allow = allow
        self.template = template


class BodyTimeout(InvalidRequest):
    """The request body stalled: no bytes arrived within the read timeout."""

    http_status = 408


class HeadersTooLarge(InvalidRequest):
    """Too many request headers, or too many bytes of them."""

    http_status = 431


class TooManyStreams(RaybatchError):
    """This client already holds as many open event streams as one client may."""

    http_status = 429


class Unavailable(RaybatchError):
    """The server is draining or holds as many requests as it may; retry shortly."""

    http_status = 503


class ClientGone(Exception):
    """The client hung up before the response: nobody is left to answer."""


def error_parts(exc: BaseException, openai: bool = False
                ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, body, headers) for `exc`: the only place an error becomes a response.
    `openai`: in OpenAI's error shape (the /v1 routes)."""
    status = http_status(exc)
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
    if status in (429, 503):  # whole seconds; the engine's hint where it has one (Overloaded)
        hint = getattr(exc, "retry_after_s", None) or 1.0
        headers.append((b"retry-after", str(max(1, math.ceil(hint))).encode()))
    if isinstance(exc, MethodNotAllowed):
        headers.append((b"allow", ", ".join(exc.allow).encode()))
    message = _message(exc)[:MAX_MESSAGE_CHARS]
    if openai:
        return status, orjson.dumps(error_doc(status, message, exc)), headers
    return status, error_body(message), headers


def _message(exc: BaseException) -> str:
    if isinstance(exc, RaybatchError):
        return str(exc) or type(exc).__name__
    name = type(exc).__name__
    if _from_model(exc):
        first = (str(exc).splitlines() or [""])[0][:300]
        return f"the model raised {name}: {first}" if first else f"the model raised {name}"
    return f"internal server error ({name}); the server log has the details"


def _from_model(exc: BaseException) -> bool:
    return any(str(n).startswith(_MODEL_NOTE) for n in getattr(exc, "__notes__", ()))


def log_error(exc: BaseException, status: int, method: str, path: str) -> None:
    """One line per client error; a traceback only for what the server did not mean."""
    where = f"{method} {shown(path)}"
    if status < 500:
        log.info("%d %s: %r", status, where, str(exc)[:300])
    elif isinstance(exc, RaybatchError) or _from_model(exc):
        log.warning("%d %s: %r", status, where, str(exc)[:300])
    else:
        log.error("%d %s: unexpected %s", status, where, type(exc).__name__, exc_info=exc)
