"""The fast path: the middleware hands the OIP routes of a mounted app to it, and
everything else (and everything, where no app is mounted) to the app it wraps."""

from __future__ import annotations

import pytest
from starlette.middleware import Middleware

from deployments.http.oip import fastpath as fast
from tests.conftest import arun as run
from tests.unit.deployments.http.fakes import call, make_app


async def inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"serve"})


@pytest.fixture
def mounted():
    app, _ = make_app()
    yield app
    fast.unmount(app)


def test_the_oip_routes_go_to_the_mounted_app_and_the_rest_to_serve(mounted):
    async def main():
        fast.mount(mounted, "/")
        middleware = fast.OipMiddleware(inner)
        return [(await call(middleware, "GET", path)).status for path in
                ("/v2/health/live", "/v2", "/v2/nope", "/-/healthz", "/v2x", "/other")]

    assert run(main()) == [200, 200, 404, 299, 299, 299]


def test_a_route_prefix_is_the_apps_root_path(mounted):
    async def main():
        fast.mount(mounted, "/small/")
        middleware = fast.OipMiddleware(inner)
        return [(await call(middleware, "GET", path)).status for path in
                ("/small/v2/models/square", "/v2/models/square", "/small/-/healthz")]

    assert run(main()) == [200, 299, 299]


def test_without_a_mounted_app_everything_goes_on(mounted):
    async def main():
        return (await call(fast.OipMiddleware(inner), "GET", "/v2/health/live")).status

    assert fast.mounted() is None and run(main()) == 299


def test_a_request_on_another_loop_goes_on_to_serve(mounted):
    async def mount_here():
        fast.mount(mounted, "/")

    run(mount_here())  # mounted on a loop that is gone now

    async def main():
        return (await call(fast.OipMiddleware(inner), "GET", "/v2/health/live")).status

    assert run(main()) == 299


def test_the_callback_returns_starlette_middleware():
    (entry,) = fast.middlewares()
    assert isinstance(entry, Middleware) and entry.cls is fast.OipMiddleware
    assert fast.FAST_PATH_ENV["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == fast.CALLBACK
    module, _, name = fast.CALLBACK.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is fast.middlewares


def test_the_front_imports_no_ray():
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys, deployments.http, deployments.http.oip.fastpath\n"
              "print(sorted(m for m in ('ray', 'fastapi') if m in sys.modules))")
    root = Path(__file__).resolve().parents[4]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


