"""The fast path: the same `OipApp` in front of Serve's per-request wrapper.

In Ray Serve's direct-ingress mode (`RAY_SERVE_ENABLE_DIRECT_INGRESS=1`) each ingress
replica runs its own HTTP server, wrapped outermost by the Starlette middlewares
that the function named in `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` returns
(`CALLBACK`, below). `OipMiddleware` is that middleware: in a replica whose Raybatch
ingress has `mount`ed its app, a request under `{route_prefix}/v2` goes straight to
the app, skipping Serve's per-request wrapper (request metadata, a disconnect-watch
task, an access-log record, route matching again: most of a request's cost);
everything else (`/-/healthz`, `/-/routes`, other paths) goes on to Serve. In a
process with no Raybatch ingress (Serve's proxy actor runs the same callback), it
passes everything on.

The app runs on the loop that called `mount`; a request arriving on another loop
(Serve runs user code on its own thread unless `RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_
THREAD=0`, which `RAY_SERVE_THROUGHPUT_OPTIMIZED=1` sets) is passed on to Serve, which
hands it to the app on the right loop: slower, never wrong. `FAST_PATH_ENV` lists the
settings the fast path needs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from deployments.http.oip.app import OipApp

log = logging.getLogger("deployments.http")

CALLBACK = "deployments.http.oip.fastpath:middlewares"
# What the ingress replicas need (their runtime env carries it: `deployments.app`) ...
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",  # one loop for Serve and the app
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": CALLBACK,
}
# ... and what the whole cluster needs, the controller included (set before `ray start`).
FAST_PATH_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", **REPLICA_ENV}


@dataclass(frozen=True, slots=True)
class _Mounted:
    app: OipApp
    loop: asyncio.AbstractEventLoop
    prefix: str  # the app's route prefix without its trailing "/"; "" for "/"
    head: str  # prefix + "/v2": the paths it takes are this, or start with it and "/"


_mounted: _Mounted | None = None
_warned = False


def mount(app: OipApp, route_prefix: str = "/") -> None:
    """Serve `app` on this process's fast path, on the running loop (the replica's)."""
    global _mounted
    prefix = route_prefix.rstrip("/")
    _mounted = _Mounted(app, asyncio.get_running_loop(), prefix, prefix + "/v2")


def unmount(app: OipApp) -> None:
    global _mounted
    if _mounted is not None and _mounted.app is app:
        _mounted = None


def mounted() -> OipApp | None:
    return None if _mounted is None else _mounted.app


class OipMiddleware:
    """An ASGI middleware: the OIP routes to the mounted app, the rest to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        m = _mounted
        if m is not None and scope["type"] == "http" and _takes(m, scope["path"]):
            if asyncio.get_running_loop() is m.loop:
                if m.prefix:
                    scope = {**scope, "root_path": scope.get("root_path", "") + m.prefix}
                return await m.app.direct(scope, receive, send)
            _warn_once()
        return await self.app(scope, receive, send)


def _takes(m: _Mounted, path: str) -> bool:
    head = m.head
    return path.startswith(head) and (len(path) == len(head) or path[len(head)] == "/")


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("the Raybatch fast path is off: Serve runs the ingress on its own "
                    "thread; set RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 (or "
                    "RAY_SERVE_THROUGHPUT_OPTIMIZED=1) for it")


def middlewares() -> list[Any]:
    """What `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` names: Serve's callback."""
    from starlette.middleware import Middleware

    return [Middleware(OipMiddleware)]
