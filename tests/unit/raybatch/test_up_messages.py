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

    from raybatch.serving import patient_router

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
