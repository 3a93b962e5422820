"""What `raybatch up` prints: the reason of a failed deploy, and an example request that
fits the first model's inputs."""

from __future__ import annotations

import json

from cluster.cli.serving import _example_input, deploy_error
from cluster.config import TensorConfig


def test_a_failed_deploy_shows_raybatchs_own_reason_not_the_traceback():
    text = ("Deploying application x failed: Failed to update the deployments ['Ingress'].\n"
            "Traceback (most recent call last):\n  File \"ingress.py\", line 9\n"
            "ray.exceptions.RayTaskError(ReplicaSetupError): ray::BatcherActor.ready()\n"
            "deployments.replica.ReplicaSetupError: model 'm': replica-0 cannot serve: "
            "X does not match\n")
    assert deploy_error(text) == "model 'm': replica-0 cannot serve: X does not match"
    assert deploy_error("something else broke") == "something else broke"


def test_the_example_request_fits_every_input():
    ids = TensorConfig(name="ids", datatype="INT64", shape=(-1, -1))
    text = TensorConfig(name="text", datatype="BYTES", shape=(-1,))
    body = json.dumps([_example_input(ids), _example_input(text)])
    assert json.loads(body) == [
        {"name": "ids", "datatype": "INT64", "shape": [1, 1], "data": [1]},
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]
