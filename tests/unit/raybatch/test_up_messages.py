"""What `raybatch up` prints: the reason of a failed deploy, and an example request that
fits the first model's inputs."""

from __future__ import annotations

import json

from cluster.config import TensorConfig
from raybatch.serving import _example_input
from raybatch.startup import deploy_error, failure


def test_a_failed_deploy_shows_raybatchs_own_reason_not_the_traceback():
    text = ("Deploying application x failed: Failed to update the deployments ['Ingress'].\n"
            "Traceback (most recent call last):\n  File \"ingress.py\", line 9\n"
            "ray.exceptions.RayTaskError(ReplicaSetupError): ray::BatcherActor.ready()\n"
            "deployments.replica.actor.ReplicaSetupError: model 'm': replica-0 cannot serve: "
            "X does not match\n")
    assert deploy_error(text) == "model 'm': replica-0 cannot serve: X does not match"
    assert deploy_error("something else broke") == "something else broke"


def test_up_fails_at_the_first_of_its_own_deploy_errors_not_after_serves_retries():
    from types import SimpleNamespace as NS

    retrying = ("A replica failed to start with exception. Retrying 2 more time(s). Error:\n"
                "ray.exceptions.RayTaskError(ReplicaSetupError): ...\n"
                "deployments.replica.actor.ReplicaSetupError: model 'm': replica-0 cannot "
                "serve: X does not match\n")
    state = NS(message="", deployments={"Ingress": NS(message=retrying)})
    assert deploy_error(failure(state, "DEPLOYING")) == (
        "model 'm': replica-0 cannot serve: X does not match")
    # anything else Serve retries (a node lost while starting) may yet run
    other = NS(message="", deployments={"Ingress": NS(message=retrying.replace(
        "ReplicaSetupError", "ActorDiedError"))})
    assert failure(other, "DEPLOYING") is None
    assert failure(NS(message="", deployments={"Ingress": NS(message=None)}), "DEPLOYING") is None
    assert failure(NS(message="gave up", deployments={}), "DEPLOY_FAILED") == "gave up"


def test_the_example_request_fits_every_input():
    ids = TensorConfig(name="ids", datatype="INT64", shape=(-1, -1))
    text = TensorConfig(name="text", datatype="BYTES", shape=(-1,))
    body = json.dumps([_example_input(ids), _example_input(text)])
    assert json.loads(body) == [
        {"name": "ids", "datatype": "INT64", "shape": [1, 1], "data": [1]},
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]


def test_the_native_server_is_the_url_printed_and_the_command_line_overrides_it(capsys):
    import argparse

    from cluster.config import load_default
    from raybatch.serving import _print_welcome, with_front_overrides

    demo = load_default(None)
    assert demo.ingress.native_port == 8088
    _print_welcome(demo, "127.0.0.1", 8000, 9000, demo.ingress.native_port)
    out = capsys.readouterr().out
    assert "Raybatch is serving at http://127.0.0.1:8088 (its own HTTP server" in out
    assert "Serve's HTTP front: http://127.0.0.1:8000" in out
    assert "curl -s http://127.0.0.1:8088/v2/models/square/infer" in out

    args = argparse.Namespace(host="0.0.0.0", native_port=0)
    off = with_front_overrides(demo, args)
    assert off.ingress.native_port is None and off.ingress.host == "0.0.0.0"
    assert with_front_overrides(demo, argparse.Namespace(host=None, native_port=None)) is demo
    moved = with_front_overrides(demo, argparse.Namespace(host=None, native_port=8099))
    assert moved.ingress.native_port == 8099 and moved.models == demo.models


def test_status_keeps_serves_queue_length_warning_out_of_its_output(monkeypatch, caplog):
    import logging
    import os

    from raybatch.status import patient_router

    monkeypatch.delenv("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", raising=False)
    logger = logging.getLogger("ray.serve")
    before = list(logger.filters)
    try:
        patient_router()
        with caplog.at_level(logging.WARNING, logger="ray.serve"):
            logger.warning("Failed to get queue length from Replica(id='x') within 0.1s.")
            logger.warning("something else")
    finally:
        logger.filters[:] = before
    assert os.environ["RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S"] == "1.0"
    assert [r.getMessage() for r in caplog.records] == ["something else"]


class _Init:
    """A stand-in for `ray.init` that fails with the given errors, then starts."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), []

    def __call__(self, **options):
        self.calls.append(options)
        if self.errors:
            raise self.errors.pop(0)


NODE_TIMEOUT = Exception("The current node timed out during startup. This could happen "
                         "because some of the raylet failed to startup or the GCS has "
                         "become overloaded.")


def _stopper(monkeypatch, ended: list):
    import ray

    from raybatch import runs
    from raybatch.startup import Stopper

    monkeypatch.setattr(ray, "shutdown", lambda: ended.append("shutdown"))
    monkeypatch.setattr(runs, "end_run", lambda run_id, **kw: ended.append(run_id))
    stopper = Stopper()
    stopper.run = runs.Run(run_id="run-1", pid=1, started=0.0, ports=[])
    return stopper


def test_up_starts_rays_node_again_when_it_missed_rays_30_s(monkeypatch, capsys):
    from raybatch.startup import start_local_ray

    ended: list = []
    stopper = _stopper(monkeypatch, ended)
    init = _Init(NODE_TIMEOUT, NODE_TIMEOUT)
    start_local_ray(init, stopper, num_cpus=2)
    assert init.calls == [{"num_cpus": 2}] * 3
    # each failed try's processes ended before the next
    assert ended == ["shutdown", "run-1", "shutdown", "run-1"]
    out = capsys.readouterr().out
    assert "try 1 of 3" in out and "try 2 of 3" in out and "starting it again" in out


def test_up_raises_the_last_node_timeout_and_any_other_error_at_once(monkeypatch):
    import pytest

    from cluster.localray import TRIES as NODE_START_TRIES
    from raybatch.startup import start_local_ray

    ended: list = []
    stopper = _stopper(monkeypatch, ended)
    init = _Init(*[NODE_TIMEOUT] * NODE_START_TRIES)
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(init, stopper)
    assert len(init.calls) == NODE_START_TRIES
    other = _Init(ValueError("bad num_cpus"))
    with pytest.raises(ValueError, match="bad num_cpus"):
        start_local_ray(other, stopper)
    assert len(other.calls) == 1
    stopper.requested.set()  # Ctrl-C while Ray started: no second start
    asked = _Init(NODE_TIMEOUT)
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(asked, stopper)
    assert len(asked.calls) == 1


def _server(statuses: list[int]):
    """An HTTP server on 127.0.0.1 answering the given statuses in turn, then 200."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(statuses.pop(0) if statuses else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_up_prints_its_urls_only_once_serves_proxy_routes_the_app(monkeypatch, capsys):
    from raybatch import startup

    monkeypatch.setattr(startup, "NOTE_EVERY_S", 0.0)  # every wait is said
    # a user's proxy (nothing listens there) is not asked for this machine's own route
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "")
    server = _server([404, 404, 404])  # Serve's proxy before it has the app's route
    url = f"http://127.0.0.1:{server.server_address[1]}/small/v2/health/ready"
    try:
        assert startup.wait_routed(url, startup.Stopper())
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert "waiting for Serve's HTTP proxy to route the app" in out and "HTTP 404" in out


def test_a_route_that_never_comes_is_said_and_up_goes_on(monkeypatch, capsys):
    from raybatch import startup

    server = _server([404] * 10_000)
    url = f"http://127.0.0.1:{server.server_address[1]}/small/v2/health/ready"
    try:
        assert not startup.wait_routed(url, startup.Stopper(), timeout_s=0.3)
        stopper = startup.Stopper()
        stopper.requested.set()  # Ctrl-C meanwhile: no wait
        assert not startup.wait_routed(url, stopper)
    finally:
        server.shutdown()
    assert "still answers HTTP 404 after 0.3 s" in capsys.readouterr().out


def test_the_route_is_probed_where_the_server_listens():
    from raybatch.startup import reachable

    assert reachable("0.0.0.0") == reachable("::") == reachable("") == "127.0.0.1"
    assert reachable("10.1.2.3") == "10.1.2.3" and reachable("fe80::1") == "[fe80::1]"


def test_up_without_an_address_starts_its_own_ray_whatever_ray_address_says(monkeypatch,
                                                                            capsys):
    import os

    from raybatch.serving import local_or

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert local_or(None) == "local" and capsys.readouterr().out == ""
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    assert local_or("") == "local"
    assert "RAY_ADDRESS" not in os.environ  # the local Ray's processes do not inherit it
    assert capsys.readouterr().out == (
        "note: RAY_ADDRESS is set (10.0.0.7:6379), but without --address `raybatch up` "
        "starts a local Ray of its own; to deploy to that cluster: raybatch up --address "
        "10.0.0.7:6379\n")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    assert local_or("head:6379") == "head:6379" and os.environ["RAY_ADDRESS"] == "10.0.0.7:6379"
    assert capsys.readouterr().out == ""
