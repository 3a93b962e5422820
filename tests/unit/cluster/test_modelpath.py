"""Bring your own model: finding its class (python_path), and errors that say what to fix
when the path is wrong, the class does not fit its batching kind, or a tensor setting is."""

from __future__ import annotations

import sys

import pytest
import yaml

from cluster.config import ConfigError, load_config
from cluster.modelpath import PYTHON_PATH_ENV, check_transformer, import_object

MODEL = {
    "name": "m", "transformer": "deployments.models:Square",
    "inputs": [{"name": "x", "datatype": "INT64", "shape": [-1, -1]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
}


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module `byo_models` in a folder that is not on sys.path."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "byo_models.py").write_text(
        "from batching import VectorTransformer\n"
        "class Ranker(VectorTransformer):\n    def transform(self, b): return b\n"
        "class NotAModel:\n    pass\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(folder)])
    monkeypatch.delenv(PYTHON_PATH_ENV, raising=False)
    yield folder
    sys.modules.pop("byo_models", None)


def test_a_module_off_the_path_is_reported_with_where_to_put_it(user_module):
    with pytest.raises(ConfigError, match=r"no module named 'byo_models'.*python_path"):
        import_object("byo_models:Ranker")


def test_python_path_from_the_environment_finds_it(user_module, monkeypatch):
    monkeypatch.setenv(PYTHON_PATH_ENV, str(user_module))
    assert import_object("byo_models:Ranker").__name__ == "Ranker"


def test_a_misspelt_class_lists_the_module_classes(user_module, monkeypatch):
    monkeypatch.setenv(PYTHON_PATH_ENV, str(user_module))
    with pytest.raises(ConfigError, match=r"has no 'Rankr'; its classes are \['NotAModel', "
                                          r"'Ranker'\]"):
        import_object("byo_models:Rankr")


def test_a_class_that_cannot_serve_its_batching_kind_is_refused(user_module, monkeypatch):
    monkeypatch.setenv(PYTHON_PATH_ENV, str(user_module))
    assert check_transformer("byo_models:Ranker", "dynamic").__name__ == "Ranker"
    with pytest.raises(ConfigError, match=r"class NotAModel has no transform.*subclass "
                                          r"batching.VectorTransformer"):
        check_transformer("byo_models:NotAModel", "dynamic")
    with pytest.raises(ConfigError, match="has no initial_state, so it cannot serve a sequence"):
        check_transformer("byo_models:Ranker", "sequence")


def test_relative_python_path_is_relative_to_the_config_file(tmp_path):
    path = tmp_path / "conf" / "my.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"python_path": [".", "../lib"], "models": [MODEL]}))
    config = load_config(path)
    assert config.python_path == (str(path.parent), str(tmp_path / "lib"))


def test_ragged_and_warmup_settings_say_what_is_wrong():
    def bad(match: str, **model) -> None:
        with pytest.raises(ConfigError, match=match):
            load_config({"models": [{**MODEL, **model}]})

    bad(r"ragged.axis=2 must name a -1 dim after the batch dim of shape=\[-1, -1\]",
        inputs=[{**MODEL["inputs"][0], "ragged": {"axis": 2}}])
    bad(r"ragged.pad_value='x' must be a number for datatype INT64",
        inputs=[{**MODEL["inputs"][0], "ragged": {"pad_value": "x"}}])
    bad(r"inputs \['x'\] are ragged, which only dynamic .* this one is sequence",
        inputs=[{**MODEL["inputs"][0], "ragged": {}}], batching={"kind": "sequence"})
    bad(r"warmup.dims names \['nope'\], which are not inputs of this model: use \['x'\]",
        warmup={"dims": {"nope": [3]}})
    bad(r"batch_sizes=\[0\]: every size must be >= 1", warmup={"batch_sizes": [0]})
