"""`serve build deployments.app:app`: a valid Serve config that deploys as written.

The output is parsed with Serve's own `ServeDeploySchema`; each batching actor
must be named by an import path that resolves to a Ray actor class (what Serve
imports when it deploys the file); and the file is then deployed (the way
`serve deploy` does, through the controller, which needs no dashboard) and
answers a request.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import yaml

from cluster.config import ModelConfig, import_object, load_config
from tests.conftest import CONFIGS, ROOT

pytestmark = pytest.mark.integration

SMALL = CONFIGS / "small.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("build") / "serve.yaml"
    serve_cli = ROOT / ".venv" / "bin" / "serve"
    cmd = [str(serve_cli) if serve_cli.exists() else "serve", "build", "deployments.app:app",
           "-o", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYBATCH_CONFIG": str(SMALL)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load(out.read_text())


def test_serve_build_output_is_a_valid_serve_config(built):
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(built)
    (application,) = schema.applications
    assert application.import_path == "deployments.app:app"
    (ingress,) = application.deployments
    assert ingress.name == "Ingress"
    config = load_config(SMALL)
    assert ingress.ray_actor_options.num_cpus == config.ingress.num_cpus
    actors = {a["name"]: a for a in ingress.deployment_actors}
    assert sorted(actors) == ["batcher-square"]
    model = ModelConfig.model_validate(
        json.loads(actors["batcher-square"]["init_kwargs"]["model_json"]))
    assert model == config.model("square")


def test_serve_build_names_each_batching_actor_by_an_importable_ray_actor_class(built):
    import ray

    for deployment in built["applications"][0]["deployments"]:
        for actor in deployment["deployment_actors"]:
            path = actor["actor_class"]
            target = import_object(path)
            assert isinstance(target, ray.actor.ActorClass), (
                f"{actor['name']}: actor_class {path!r} is {target!r}, not a @ray.remote class: "
                "Serve cannot create the actor when it deploys this file")


def test_serve_build_output_deploys_and_serves(app, built):
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    name = "raybatch-built"
    (application,) = built["applications"]
    application.update(name=name, route_prefix="/built",
                       runtime_env={"env_vars": {"RAYBATCH_CONFIG": str(SMALL)}})
    deploy = {"applications": [application]}  # only the app: Serve itself runs already
    client = _get_global_client()
    client.deploy_apps(ServeDeploySchema.model_validate(deploy), _blocking=True)
    try:
        handle = serve.get_app_handle(name)
        out = handle.infer.remote("square", {"INPUT0": np.array([6.0], np.float32)})
        np.testing.assert_array_equal(out.result(timeout_s=60)["OUTPUT0"], [36.0])
    finally:
        serve.delete(name)
