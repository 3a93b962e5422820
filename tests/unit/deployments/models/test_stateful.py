"""The stateful demo models, run through a real StateStore, in process, without Ray."""

from __future__ import annotations

import numpy as np

from batching.sequence.stateful import SequenceBatchInput, StateStore
from deployments.models.stateful import GRU, Accumulator


def step(store, items, sids, start=None, end=None, ready=None):
    n = len(sids)
    return store.run(SequenceBatchInput(items, tuple(sids), tuple(start or [False] * n),
                                        tuple(end or [False] * n), tuple(ready or [True] * n)))


def i32(*values) -> np.ndarray:
    return np.array([[v] for v in values], dtype=np.int32)


def test_accumulator_sums_a_sequence_like_tritons_simple_sequence():
    store = StateStore(Accumulator())
    outs = [step(store, i32(5), [1], start=[True])[0], step(store, i32(2), [1])[0],
            step(store, i32(-3), [1], end=[True])[0]]
    assert [o.tolist() for o in outs] == [[5], [7], [4]]
    assert all(o.dtype == np.int32 and o.shape == (1,) for o in outs)
    assert store.live == 0


def test_accumulator_keeps_sequences_apart_and_ignores_rows_that_are_not_ready():
    store = StateStore(Accumulator())
    step(store, i32(1, 100), [1, 2], start=[True, True])
    out = step(store, i32(10, 999), [1, None], ready=[True, False])
    assert out[0].tolist() == [11] and out[1] is None
    assert step(store, i32(5, 1), [2, 1])[0].tolist() == [105]  # 2 untouched by the 999
    assert step(store, i32(7), [2], start=[True])[0].tolist() == [7]  # a start resets
    assert step(store, [np.array([1], np.int32)], [1])[0].tolist() == [13]  # a list works too


def run_gru(model, xs: np.ndarray, sids: list, ready: np.ndarray) -> dict:
    """xs: (steps, rows, 8); every row whose `ready` is True takes a step of its sequence."""
    store, outs = StateStore(model), {s: [] for s in sids}
    started = set()
    for t in range(xs.shape[0]):
        start = [s not in started and bool(r) for s, r in zip(sids, ready[t])]
        started.update(s for s, r in zip(sids, ready[t]) if r)
        rows = step(store, xs[t], [s if r else None for s, r in zip(sids, ready[t])],
                    start=start, ready=[bool(r) for r in ready[t]])
        for s, r, o in zip(sids, ready[t], rows):
            if r:
                outs[s].append(o)
    return outs


def test_gru_batched_equals_alone_and_rows_that_are_not_ready_change_nothing():
    model = GRU()
    model.setup("cpu")
    rng = np.random.default_rng(3)
    steps, rows = 12, 16
    xs = rng.standard_normal((steps, rows, 8), dtype=np.float32)
    ready = rng.random((steps, rows)) < 0.7
    batched = run_gru(model, xs, list(range(1, rows + 1)), ready)
    for i in range(rows):
        alone = run_gru(model, xs[:, i:i + 1], [i + 1], ready[:, i:i + 1])[i + 1]
        assert len(alone) == ready[:, i].sum() > 0
        np.testing.assert_allclose(np.stack(batched[i + 1]), np.stack(alone), rtol=0, atol=1e-5)
    first = batched[1][0]
    assert first.shape == (8,) and first.dtype == np.float32


def test_gru_weights_come_from_the_seed():
    a, b, c = GRU(), GRU(), GRU(seed=1)
    for m in (a, b, c):
        m.setup("cpu")
    x = np.ones((1, 8), np.float32)
    outs = [step(StateStore(m), x, [1], start=[True])[0] for m in (a, b, c)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.allclose(outs[0], outs[2])
    store = StateStore(a)
    first = step(store, x, [1], start=[True])[0]
    assert not np.allclose(step(store, x, [1])[0], first)  # the state carries over
