"""The weight cache: where it lives, and `warm` filling it for the models that cache."""

from __future__ import annotations

from pathlib import Path

from deployments.models import weightcache
from deployments.models.tinylm import TinyLM

CONFIG = """
app_name: warm
models:
  - name: gen
    transformer: deployments.models:TinyLM
    init_kwargs: {train_steps: 1}
    inputs:  [{name: text_input, datatype: BYTES, shape: [-1]}]
    outputs: [{name: text_output, datatype: BYTES, shape: [-1]}]
    batching: {kind: iterative}
  - name: square
    transformer: deployments.models:Square
    inputs:  [{name: INPUT0, datatype: FP32, shape: [-1]}]
    outputs: [{name: OUTPUT0, datatype: FP32, shape: [-1]}]
"""


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("RAYBATCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weightcache.cache_dir() == tmp_path / "xdg" / "raybatch"
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path / "own"))
    assert weightcache.cache_dir() == tmp_path / "own"


def test_keys_differ_with_params_and_data():
    base = weightcache.cache_key("m", {"seed": 0}, b"text")
    assert base == weightcache.cache_key("m", {"seed": 0}, b"text")
    assert base != weightcache.cache_key("m", {"seed": 1}, b"text")
    assert base != weightcache.cache_key("m", {"seed": 0}, b"other text")
    assert base.startswith("m-") and base.endswith(".pt")


def test_warm_sets_up_the_models_that_cache_and_the_next_setup_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "warm.yaml"
    config.write_text(CONFIG)
    assert weightcache.warm(str(config)) == ["gen"]
    assert len(list(Path(tmp_path / "cache").glob("tinylm-*.pt"))) == 1
    m = TinyLM(train_steps=1)
    m.setup("cpu")
    assert m.weights_cached
