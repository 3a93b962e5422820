"""The HTTP front door: the Open Inference Protocol as a raw ASGI app (no framework, no Ray),
and the two servers of Raybatch's own that run it. Split by job, in the order a request
meets them:

native/ (the native front, ingress.native_front)
    _front.c      a thread of its own holds every socket, frames every request with
                  llhttp, and queues the infer requests it recognises; other requests go
                  to Python as events (whole, or streamed), refusals as events too
    front.py      its Python side: the server object, the events taken
    exchange.py   request events answered by pyserver's Cycle, written back in order
    blocks.py     plans learnt from the Python server, blocks of queued requests to the
                  engine, their answers; gather.py: blocks filled while a batch is in flight
pyserver/ (Raybatch's own HTTP/1.1 server, ingress.native_port)
    server.py     connections, keep-alive sweep, stop; portclaim.py: one app per port
    connection.py parsing (httptools), pipelining, flow control, every hostile-client rule
    framing.py    what a request head says about its framing (RFC 9112)
    cycle.py      one request's ASGI receive/send and the response's framing (one write)
oip/ (the app every server runs: Serve's proxy, pyserver, the native front's Python side)
    fastpath.py   a Serve direct-ingress middleware that hands OIP routes to the app before
                  Serve's per-request wrapper; FAST_PATH_ENV
    app.py        OipApp: drain/in-flight gate, header limits, route, handler, reply,
                  response counts; lifespan; Call (what a handler sees)
    routes.py     the route table: (method, path template) -> handler; 404 / 405
    body.py       the one body reader: size limit and stall timeout while reading
    handlers.py   the OIP routes, a few lines each: health, metadata, stats, infer,
                  generate, generate_stream (SSE); openai.py: the OpenAI routes
    replies.py    Reply / EventStream and how they go out (zero-copy parts, SSE pump
                  that cancels the generation when the client hangs up)
    errors.py     the front's errors and the one error writer: {"error": ...}, one log
                  line per client error
    limits.py     HttpLimits, read once from IngressConfig
    backend.py    the Backend seam: what runs the models (Serve's, or a fake in tests)

Parsing and encoding live in `deployments.protocol`; running, behind `Backend`.
"""

from deployments.http.oip.app import OipApp
from deployments.http.oip.backend import Backend, ModelEntry
from deployments.http.oip.errors import UnknownModel
from deployments.http.oip.fastpath import CALLBACK, FAST_PATH_ENV, REPLICA_ENV, mount, unmount
from deployments.http.oip.limits import HttpLimits

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
