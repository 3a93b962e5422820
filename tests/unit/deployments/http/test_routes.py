"""The route table: a path and a method to a handler, or a 404/405 that says why."""

from __future__ import annotations

import pytest

from deployments.http.oip.errors import MethodNotAllowed, NoRoute
from deployments.http.oip.handlers import oip_routes
from deployments.http.oip.routes import Route, Router

ROUTER = Router(oip_routes())


def name_of(method: str, path: str) -> tuple[str, str, dict]:
    route, params = ROUTER.match(method, path)
    return route.handler.__name__, route.template, params


@pytest.mark.parametrize(("method", "path", "handler", "params"), [
    ("GET", "/v2", "server_metadata", {}),
    ("GET", "/v2/health/live", "live", {}),
    ("GET", "/v2/health/ready", "server_ready", {}),
    ("GET", "/v2/models/stats", "all_stats", {}),
    ("POST", "/v2/repository/index", "repository_index", {}),
    ("GET", "/v2/models/mlp", "model_metadata", {"model": "mlp"}),
    ("GET", "/v2/models/mlp/versions/1", "model_metadata", {"model": "mlp", "version": "1"}),
    ("GET", "/v2/models/mlp/config", "model_config", {"model": "mlp"}),
    ("GET", "/v2/models/m.v-2_x/versions/7/ready", "model_ready",
     {"model": "m.v-2_x", "version": "7"}),
    ("GET", "/v2/models/mlp/stats", "model_stats", {"model": "mlp"}),
    ("POST", "/v2/models/mlp/infer", "infer", {"model": "mlp"}),
    ("POST", "/v2/models/mlp/versions/3/infer", "infer", {"model": "mlp", "version": "3"}),
    ("POST", "/v2/models/tinylm/generate", "generate", {"model": "tinylm"}),
    ("POST", "/v2/models/tinylm/generate_stream", "generate_stream", {"model": "tinylm"}),
    ("POST", "/v2/models/stats/infer", "infer", {"model": "stats"}),
    ("GET", "/v2/models/x/versions/stats", "model_metadata", {"model": "x", "version": "stats"}),
])
def test_every_protocol_route_matches_with_its_parameters(method, path, handler, params):
    got_handler, _, got_params = name_of(method, path)
    assert (got_handler, got_params) == (handler, params)


@pytest.mark.parametrize("path", [
    "/", "/v1/models/mlp/infer", "/v2/", "/v2/models", "/v2/models/", "/v2/models//infer",
    "/v2/models/../../etc/passwd", "/v2/models/..", "/v2/models/../infer",
    "/v2/models/mlp/infer/", "/v2/models/mlp/versions//infer", "/v2/models/mlp/explain",
    "/v2/models/-x/infer", "/v2/models/m%20x/infer", "/v2/models/m\x00/infer",
    "/v2/models/mlp/versions/1/2/infer", "/v2/health", "/V2/health/live", "//v2",
])
def test_anything_else_is_no_route(path):
    with pytest.raises(NoRoute) as info:
        ROUTER.match("GET", path)
    assert info.value.http_status == 404 and "Open Inference Protocol under /v2" in str(info.value)


@pytest.mark.parametrize(("method", "path", "allow", "template"), [
    ("GET", "/v2/models/mlp/infer", ("POST",), "/v2/models/{model}/infer"),
    ("PUT", "/v2/models/mlp/infer", ("POST",), "/v2/models/{model}/infer"),
    ("DELETE", "/v2/models/mlp/versions/1/infer", ("POST",),
     "/v2/models/{model}/versions/{version}/infer"),
    ("POST", "/v2/health/live", ("GET",), "/v2/health/live"),
    ("POST", "/v2/models/mlp", ("GET",), "/v2/models/{model}"),
])
def test_a_known_path_with_the_wrong_method_is_405_naming_the_allowed_ones(
        method, path, allow, template):
    with pytest.raises(MethodNotAllowed) as info:
        ROUTER.match(method, path)
    error = info.value
    assert error.http_status == 405 and error.allow == allow and error.template == template
    assert f"{method} is not allowed" in str(error) and allow[0] in str(error)


def test_several_methods_on_one_path():
    router = Router([Route("GET", "/a/{x}", "get"), Route("POST", "/a/{x}", "post")])
    assert router.match("POST", "/a/1")[0].handler == "post"
    with pytest.raises(MethodNotAllowed) as info:
        router.match("PATCH", "/a/1")
    assert info.value.allow == ("GET", "POST")


def test_a_fixed_path_wins_over_a_template():
    assert name_of("GET", "/v2/models/stats")[1] == "/v2/models/stats"
