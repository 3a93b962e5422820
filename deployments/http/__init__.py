"""The HTTP front door: the Open Inference Protocol as a raw ASGI app (no framework, no Ray).

In the order a request meets it
    front.py      the native front (ingress.native_front): _front.c's thread holds the
                  sockets and queues the infer requests it recognises; the rest go to
                  server.py's Connection through it; blocks.py: plans learnt from the
                  Python server, blocks of queued requests to the engine, their answers
    server.py     Raybatch's own HTTP/1.1 server (ingress.native_port): connections,
                  parsing, limits, keep-alive sweep, stop; cycle.py: one request's ASGI
                  receive/send and the response's framing (one write); portclaim.py: one
                  app per native port on a node
    fastpath.py   the fast path: a Serve direct-ingress middleware that hands OIP routes
                  to the app before Serve's per-request wrapper; FAST_PATH_ENV
    app.py        OipApp: drain/in-flight gate, header limits, route, handler, reply,
                  response counts; lifespan; Call (what a handler sees)
    routes.py     the route table: (method, path template) -> handler; 404 / 405
    body.py       the one body reader: size limit and stall timeout while reading
    handlers.py   the OIP routes, a few lines each: health, metadata, stats, infer,
                  generate, generate_stream (SSE)
    replies.py    Reply / EventStream and how they go out (zero-copy parts, SSE pump
                  that cancels the generation when the client hangs up)
    errors.py     the front's errors and the one error writer: {"error": ...}, one log
                  line per client error
    limits.py     HttpLimits, read once from IngressConfig
    backend.py    the Backend seam: what runs the models (Serve's, or a fake in tests)

Parsing and encoding live in `deployments.protocol`; running, behind `Backend`.
"""

from deployments.http.app import OipApp
from deployments.http.backend import Backend, ModelEntry
from deployments.http.errors import UnknownModel
from deployments.http.fastpath import CALLBACK, FAST_PATH_ENV, REPLICA_ENV, mount, unmount
from deployments.http.limits import HttpLimits

__all__ = [
    "CALLBACK",
    "FAST_PATH_ENV",
    "REPLICA_ENV",
    "Backend",
    "HttpLimits",
    "ModelEntry",
    "OipApp",
    "UnknownModel",
    "mount",
    "unmount",
]
