"""Bring your own model: the examples of the docs' "Serving your model" page (stateless, and
stateful under "A stateful model"), copied out of the page into a folder of their own (outside
this repository), served with `raybatch up` and with `raybatch build`; a wrong import
path and a class that does not fit its declared tensors fail before any traffic, saying
what to fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def readme_example(subsection: str | None = None) -> tuple[str, str]:
    """The (first) python and yaml blocks of the docs' "Serving your model" page: its
    "A stateless model" section, or `subsection`."""
    text = (ROOT / "docs" / "your-model.md").read_text()
    heading = subsection or "A stateless model"
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    config = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return code, config


@pytest.fixture
def project(tmp_path):
    """The example in tmp/project; returns a function writing my.yaml with changes."""
    code, config = readme_example()
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "my_models.py").write_text(code)

    def write(name: str, prefix: str, transformer: str | None = None):
        data = yaml.safe_load(config)
        data["app_name"] = name
        data["ingress"]["route_prefix"] = prefix  # beside the session's app
        if transformer:
            data["models"][0]["transformer"] = transformer
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def raybatch(*args: str, cwd, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """The CLI, run from `cwd`."""
    exe = shutil.which("raybatch", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "raybatch"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)


def away(tmp_path) -> dict:
    """Run from a folder that is neither the project nor this repository."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return {"cwd": str(elsewhere)}


def check_scorer(name: str) -> None:
    from ray import serve

    handle = serve.get_app_handle(name)
    out = handle.infer.remote("scorer", {
        "text": np.array([b"Ray Serve batches", "hello"], dtype=object),
        "boost": np.array([2.0, 1.0], np.float32)}).result(timeout_s=60)
    assert out["hits"].tolist() == [3, 0] and out["score"].tolist() == [6.0, 0.0]


def test_raybatch_build_renders_a_file_that_serves_your_model(app, project, tmp_path):
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    path = project("byom-built", "/byom-built")
    out = tmp_path / "serve.yaml"
    proc = raybatch("build", "--config", str(path), "-o", str(out), **away(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (application,) = yaml.safe_load(out.read_text())["applications"]
    assert application["args"]["config"]["python_path"] == [str(path.parent)]
    client = _get_global_client()
    client.deploy_apps(ServeDeploySchema.model_validate({"applications": [application]}),
                       _blocking=True)
    try:
        check_scorer("byom-built")
    finally:
        serve.delete("byom-built")


def test_raybatch_up_serves_your_model_from_another_folder(app, project, tmp_path):
    from ray import serve

    path = project("byom-up", "/byom-up")
    proc = raybatch("up", "--address", app.gcs_address, "--config", str(path),
                    "--exit-after-deploy", **away(tmp_path))
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "scorer" in proc.stdout
    try:
        check_scorer("byom-up")
    finally:
        serve.delete("byom-up")


def test_a_wrong_import_path_fails_before_ray_starts_saying_what_to_fix(project, tmp_path):
    path = project("byom-typo", "/byom-typo", transformer="my_model:KeywordScorer")
    for command in ("up", "build"):
        proc = raybatch(command, "--config", str(path), **away(tmp_path))
        assert proc.returncode == 2, proc.stdout
        assert "no module named 'my_model'" in proc.stderr, proc.stderr
        assert "python_path" in proc.stderr and "Traceback" not in proc.stderr
    path = project("byom-typo", "/byom-typo", transformer="my_models:KeywordScore")
    proc = raybatch("build", "--config", str(path), **away(tmp_path))
    assert "has no 'KeywordScore'; its classes are ['KeywordScorer']" in proc.stderr


def test_a_class_that_does_not_fit_its_tensors_fails_the_deploy(app, project, tmp_path):
    path = project("byom-mismatch", "/byom-mismatch")
    code = (path.parent / "my_models.py").read_text()
    (path.parent / "my_models.py").write_text(code.replace('"score":', '"scores":'))
    proc = raybatch("up", "--address", app.gcs_address, "--config", str(path),
                    "--exit-after-deploy", **away(tmp_path))
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert ("the app did not deploy: model 'scorer': replica-0 cannot serve: "
            "my_models:KeywordScorer does not match the tensors declared for it") in proc.stdout
    assert "missing ['score']: undeclared ['scores']" in proc.stdout
    assert app.handle.infer.remote("square", {"INPUT0": np.ones(1, np.float32)}).result(
        timeout_s=30)["OUTPUT0"].tolist() == [1.0]


@pytest.fixture
def stateful_project(tmp_path):
    """The docs' stateful example in tmp/stateful, as an app beside the session's."""
    code, config = readme_example("A stateful model")
    folder = tmp_path / "stateful"
    folder.mkdir()
    module = re.search(r"transformer: (\w+):", config).group(1)
    (folder / f"{module}.py").write_text(code)
    data = yaml.safe_load(config)
    data["app_name"] = "byom-stateful"
    data["ingress"]["route_prefix"] = "/byom-stateful"
    path = folder / "my_stateful.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_raybatch_up_serves_the_readmes_stateful_model(app, stateful_project, tmp_path):
    from ray import serve

    proc = raybatch("up", "--address", app.gcs_address, "--config", str(stateful_project),
                    "--exit-after-deploy", **away(tmp_path))
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    try:
        handle = serve.get_app_handle("byom-stateful")

        def step(x, sid, **controls):
            out = handle.infer.remote("running_mean", {"x": np.array([x], np.float32)},
                                      {"sequence_id": sid, **controls}).result(timeout_s=60)
            return out["mean"].tolist(), out["count"].tolist()

        assert step([1, 2, 3], 7, sequence_start=True) == ([[1, 2, 3]], [1])
        assert step([10, 10, 10], "other", sequence_start=True) == ([[10, 10, 10]], [1])
        assert step([3, 4, 5], 7, sequence_end=True) == ([[2, 3, 4]], [2])  # as the docs say
        assert step([0, 0, 0], "other", sequence_end=True) == ([[5, 5, 5]], [2])
        with pytest.raises(Exception, match="must specify a non-zero or non-empty correlation"):
            handle.infer.remote("running_mean", {"x": np.zeros((1, 3), np.float32)}
                                ).result(timeout_s=60)
    finally:
        serve.delete("byom-stateful")


def test_a_stateful_class_that_does_not_fit_its_tensors_fails_the_deploy(
        app, stateful_project, tmp_path):
    module = next(stateful_project.parent.glob("*.py"))
    module.write_text(module.read_text().replace('"count": count}', '"counts": count}'))
    proc = raybatch("up", "--address", app.gcs_address, "--config", str(stateful_project),
                    "--exit-after-deploy", **away(tmp_path))
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "does not match the tensors declared for it" in proc.stdout, proc.stdout[-2000:]
    assert "missing ['count']: undeclared ['counts']" in proc.stdout, proc.stdout[-2000:]
