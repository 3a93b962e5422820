"""TinyLM: setup without training, its vocabulary, the KV cache against full
recomputation, batched steps against single ones token for token, the context limit,
seeds, training, and sampling (step_logits: the same tokens in any batch)."""

from __future__ import annotations

import pytest

from batching.iterative.generative import Generator
from batching.iterative.scheduler import Join
from deployments.models.tinylm import CHARS, EOS_ID, VOCAB, TinyLM

PROMPTS = ["The river", "a", "Once upon a time, there was", "xyz " * 12, "Q?", "\n\n"]


@pytest.fixture(scope="module")
def model() -> TinyLM:
    m = TinyLM()
    m.setup("cpu")
    return m


def generate(model, prompts, max_tokens, *, batch: int) -> list[str]:
    """Greedy texts of `prompts`, `batch` sequences joining per step as slots free up;
    `max_tokens` an int, or one per prompt."""
    gen, texts = Generator(model), [""] * len(prompts)
    limits = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    waiting = list(range(len(prompts)))
    while waiting or gen.live:
        room = batch - gen.live
        join = [Join(i, prompts[i], limits[i], ()) for i in waiting[:room]]
        waiting = waiting[len(join):]
        for out in gen.step(join, []):
            texts[out.id] += out.text
    return texts


def test_setup_without_train_arguments_neither_trains_nor_reads_the_cache(tmp_path,
                                                                          monkeypatch):
    """What kept setup quick: no training step, no weight cache touched (its speed is not
    a unit test's to judge)."""
    import deployments.models.tinylm as tinylm

    def no_training(*args, **kwargs):
        raise AssertionError("trained at setup without train_steps or train_s")

    monkeypatch.setattr(tinylm, "_train", no_training)
    monkeypatch.setattr(TinyLM, "_trained_state", no_training)
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path))
    m = TinyLM()
    m.setup("cpu")
    assert m.trained_steps == 0 and not m.weights_cached and not any(tmp_path.iterdir())
    ids = m.encode("The river")
    assert len(m.reference(ids, 5)) == 5


def test_vocabulary_is_printable_ascii_newline_and_eos(model):
    assert VOCAB == 97 and len(CHARS) == 96 and EOS_ID == 96
    assert model.decode(model.encode("Hi there!\n~")) == "Hi there!\n~"
    assert model.decode(model.encode("tab\there é")) == "tab?here ?"  # others read as "?"
    assert model.decode([*model.encode("ab"), EOS_ID]) == "ab"
    assert TinyLM.count_tokens("héllo\n") == len(model.encode("héllo\n")) == 6


def test_the_kv_cache_matches_recomputing_the_whole_sequence(model):
    for prompt in PROMPTS:
        ids = model.encode(prompt)
        [state] = model.prefill([ids])
        cached = []
        for _ in range(20):
            [token], [state] = model.step([state])
            cached.append(token)
        assert cached == model.reference(ids, 20), prompt


def test_batched_steps_equal_one_sequence_at_a_time_token_for_token(model):
    alone = generate(model, PROMPTS, 40, batch=1)
    assert generate(model, PROMPTS, 40, batch=len(PROMPTS)) == alone
    assert generate(model, PROMPTS, 40, batch=2) == alone  # joining mid-way changes nothing
    assert len(set(alone)) == len(PROMPTS)


def test_kv_rows_move_as_sequences_leave_and_two_generators_may_share_the_model(model):
    limits = [5, 40, 12, 33, 7, 21]  # sequences leave at different steps: rows move
    alone = generate(model, PROMPTS, limits, batch=1)
    assert generate(model, PROMPTS, limits, batch=3) == alone
    a, b = Generator(model), Generator(model)  # each steps a subset of the pool's rows
    texts = {}
    outs = a.step([Join(i, PROMPTS[i], limits[i], ()) for i in (0, 1, 2)], [])
    outs += b.step([Join(i, PROMPTS[i], limits[i], ()) for i in (3, 4, 5)], [])
    while a.live or b.live:
        for o in outs:
            texts[o.id] = texts.get(o.id, "") + o.text
        outs = (a.step([], []) if a.live else []) + (b.step([], []) if b.live else [])
    for o in outs:
        texts[o.id] = texts.get(o.id, "") + o.text
    assert [texts[i] for i in range(6)] == alone
    assert model.live == 0  # every finished sequence gave its row back


def test_a_sequence_reaching_the_context_finishes_with_length(model):
    gen = Generator(model)
    outs = gen.step([Join("near", "x" * 250, 100, ()), Join("full", "y" * 256, 100, ())], [])
    assert [(o.id, o.finished, o.tokens) for o in outs] == [
        ("full", "length", 0), ("near", None, 1)]
    reasons = []
    while gen.live:
        reasons += [o.finished for o in gen.step([], [])]
    assert len(reasons) == 5 and reasons[-1] == "length"  # 250 + 6 = 256


def test_the_seed_picks_the_weights_and_the_same_seed_gives_the_same_text(model):
    other_same, other_seed = TinyLM(seed=0), TinyLM(seed=1)
    other_same.setup("cpu")
    other_seed.setup("cpu")
    base = generate(model, PROMPTS[:3], 20, batch=3)
    assert generate(other_same, PROMPTS[:3], 20, batch=3) == base
    assert generate(other_seed, PROMPTS[:3], 20, batch=3) != base


def test_untrained_it_does_not_end_early_and_training_is_deterministic(model, tmp_path,
                                                                       monkeypatch):
    ids = model.encode("The river ran")
    assert EOS_ID not in model.reference(ids, 60)
    a, b = TinyLM(train_steps=3), TinyLM(train_steps=3)
    for m, cache in ((a, "a"), (b, "b")):  # each trains: a cache of its own
        monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path / cache))
        m.setup("cpu")
        assert m.trained_steps == 3 and not m.weights_cached
    assert a.reference(ids, 15) == b.reference(ids, 15) != model.reference(ids, 15)


def test_trained_weights_are_cached_by_key_and_loaded_next_time(tmp_path, monkeypatch):
    import deployments.models.tinylm as tinylm

    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path))
    first = TinyLM(train_steps=2)
    first.setup("cpu")
    assert not first.weights_cached and len(list(tmp_path.glob("tinylm-*.pt"))) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("trained again although the weights are cached")

    monkeypatch.setattr(tinylm, "_train", no_training)
    again = TinyLM(train_steps=2)
    again.setup("cpu")
    assert again.weights_cached and again.trained_steps == 2
    ids = first.encode("Once upon")
    assert again.reference(ids, 20) == first.reference(ids, 20)
    with pytest.raises(AssertionError, match="trained again"):  # another key: not loaded
        TinyLM(train_steps=2, seed=1).setup("cpu")


def test_a_damaged_cache_file_is_recomputed_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(tmp_path))
    TinyLM(train_steps=1).setup("cpu")
    (path,) = tmp_path.glob("tinylm-*.pt")
    path.write_bytes(b"not a torch file")
    m = TinyLM(train_steps=1)
    m.setup("cpu")
    assert not m.weights_cached and path.stat().st_size > 1000
    m2 = TinyLM(train_steps=1)
    m2.setup("cpu")
    assert m2.weights_cached


def test_an_unwritable_cache_still_gives_trained_weights(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("RAYBATCH_CACHE_DIR", str(blocker / "raybatch"))
    m = TinyLM(train_steps=1)
    m.setup("cpu")
    assert m.trained_steps == 1 and not m.weights_cached


def run_joins(model, schedule) -> dict:
    """schedule[i]: the joins of step i; then steps until every sequence ends."""
    gen, texts, i = Generator(model), {}, 0
    while i < len(schedule) or gen.live:
        for o in gen.step(schedule[i] if i < len(schedule) else [], []):
            texts[o.id] = texts.get(o.id, "") + o.text
        i += 1
    return texts


def test_a_seeded_sample_is_the_same_alone_and_in_any_batch_and_row(model):
    x = Join("x", "Once upon a time", 40, (), 1.2, 0.9, 1234)
    alone = run_joins(model, [[x]])["x"]
    others = [Join(i, p, 5 + 7 * i, (), 0.8 * (i % 2), 0.95, i) for i, p in enumerate(PROMPTS)]
    for schedule in ([[x, *others]], [[*others[::-1], x]], [others[:3], [], [x], others[3:]]):
        got = run_joins(model, schedule)  # rows move as the short ones leave
        assert got["x"] == alone
        assert got[0] == generate(model, PROMPTS[:1], 5, batch=1)[0]  # a greedy mate
    assert model.live == 0
    assert run_joins(model, [[Join("x", "Once upon a time", 40, (), 1.2, 0.9, 4321)]])[
        "x"] != alone


def test_temperature_zero_or_a_tiny_top_p_is_greedy_and_step_logits_shares_step(model):
    greedy = generate(model, PROMPTS[:3], 25, batch=3)
    for t, p in ((0.0, 0.5), (0.7, 1e-9)):
        got = run_joins(model, [[Join(i, PROMPTS[i], 25, (), t, p, 9) for i in range(3)]])
        assert [got[i] for i in range(3)] == greedy
    a, b = model.prefill([model.encode("The river")]), model.prefill([model.encode("The river")])
    seen = []

    def argmax(logits):
        seen.append((tuple(logits.shape), logits.dtype))
        return logits.argmax(dim=-1).tolist()

    for _ in range(5):
        (ta, *_), a = model.step(a)
        (tb, *_), b = model.step_logits(b, argmax)
        assert ta == tb
    assert seen[0][0] == (1, VOCAB) and str(seen[0][1]) == "torch.float64"


@pytest.mark.gpu
def test_setup_on_cuda_generates_the_same_text():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpu = TinyLM()
    gpu.setup("cuda")
    cpu = TinyLM()
    cpu.setup("cpu")
    assert generate(gpu, PROMPTS, 30, batch=4) == generate(cpu, PROMPTS, 30, batch=1)
    x = Join("x", "Once upon a time", 40, (), 1.2, 0.9, 1234)  # torch logits on the GPU
    mates = [Join(i, p, 30, (), 0.8 * (i % 2), 0.95, i) for i, p in enumerate(PROMPTS)]
    on_gpu = run_joins(gpu, [mates[:2], [x], mates[2:]])
    assert on_gpu == run_joins(cpu, [[x, *mates]])  # float64: the same draws pick the same
