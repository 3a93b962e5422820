"""Sampling (temperature, top_p, seed): the checks of each parameter, determinism whatever
shares the batch, greedy equivalents, seeds, the distribution drawn, and per-sequence
failures (a model that cannot sample; logits without a distribution)."""

from __future__ import annotations

import math
import pickle
from collections import Counter

import numpy as np
import pytest

from batching.errors import BatchSizeMismatch, InvalidRequest, ModelError
from batching.iterative.generative import Generator, StepModel
from batching.iterative.policy import IterativePolicy
from batching.iterative.sampling import Chooser, SeqSampler, check_sampling, sample_rows
from batching.iterative.scheduler import GenerateRequest, IterativeScheduler, Join, StepOutput

V = 16
TABLE = np.random.default_rng(0).normal(size=(V, V)) * 1.5  # logits of next | last token


class Table(StepModel):
    """A Markov chain over V letters: the next token's logits are TABLE[last token]. No
    eos, no context limit: a sequence runs to its max_tokens."""

    def __init__(self, logits_as: str = "numpy") -> None:
        self.logits_as = logits_as
        self.calls: Counter = Counter()

    def encode(self, text):
        return [(ord(c) - 97) % V for c in text]

    def decode(self, tokens):
        return "".join(chr(97 + t) for t in tokens)

    def prefill(self, prompts):
        return [p[-1] for p in prompts]  # the state: the last token

    def logits(self, states):
        return TABLE[states]

    def step(self, states):
        self.calls["step"] += 1
        tokens = self.logits(states).argmax(axis=1).tolist()
        return tokens, list(tokens)

    def step_logits(self, states, choose):
        self.calls["step_logits"] += 1
        logits = self.logits(states)
        if self.logits_as == "torch":
            logits = pytest.importorskip("torch").from_numpy(logits)
        tokens = choose(logits)
        return tokens, list(tokens)


class Fixed(Table):
    """The same distribution after every token: logits = log(probs)."""

    def __init__(self, probs) -> None:
        super().__init__()
        with np.errstate(divide="ignore"):
            self.row = np.log(np.asarray(probs, dtype=float))

    def logits(self, states):
        return np.tile(self.row, (len(states), 1))


class Greedy(Table):
    step_logits = StepModel.step_logits  # no logits: decodes greedily only


def generate(model, schedule) -> dict:
    """Run a Generator: schedule[i] is the joins of step i (then steps until all end);
    each sequence's text and finish reason, or its error."""
    gen, got = Generator(model), {}
    i = 0
    while i < len(schedule) or gen.live:
        for o in gen.step(schedule[i] if i < len(schedule) else [], []):
            text, _ = got.get(o.id, ("", None))
            got[o.id] = (text + o.text, o.error or o.finished)
        i += 1
    return got


def sampled(rid, prompt="ab", n=24, t=1.0, p=1.0, seed=7) -> Join:
    return Join(rid, prompt, n, (), t, p, seed)


# -- the checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("params, words", [
    ({"temperature": "0.5"}, r"'temperature' must be a number from 0 to 2"),
    ({"temperature": True}, r"'temperature' must be a number"),
    ({"temperature": -0.1}, r"'temperature' is -0.1, out of range: send a number from 0 to 2"),
    ({"temperature": 2.5}, r"'temperature' is 2.5, out of range"),
    ({"temperature": math.nan}, r"'temperature' is nan, out of range"),
    ({"top_p": 0}, r"'top_p' must be a number above 0 and at most 1 .*got 0$"),
    ({"top_p": 1.5}, r"'top_p' must be .*got 1.5"),
    ({"top_p": -1}, r"'top_p' must be .*got -1"),
    ({"top_p": "1"}, r"'top_p' must be .*got '1'"),
    ({"top_p": False}, r"'top_p' must be .*got False"),
    ({"seed": -1}, r"'seed' must be an integer from 0 to 2\*\*63 - 1, got -1"),
    ({"seed": 2**63}, r"'seed' must be an integer .*got 9223372036854775808"),
    ({"seed": 1.0}, r"'seed' must be an integer .*got 1.0: send one, or leave it out"),
    ({"seed": True}, r"'seed' must be an integer .*got True"),
    ({"seed": "7"}, r"'seed' must be an integer .*got '7'"),
])
def test_each_bad_sampling_parameter_is_refused_with_what_to_send(params, words):
    from deployments.wire.generation import generate_request  # the OIP / OpenAI edge

    with pytest.raises(InvalidRequest, match=words):
        check_sampling(**params)
    with pytest.raises(InvalidRequest, match=words):
        generate_request(1, "prompt", params)
    s = IterativeScheduler(IterativePolicy())  # a Python caller's GenerateRequest too
    with pytest.raises(InvalidRequest, match=words):
        s.submit(GenerateRequest("a", "p", **params), now=0.0)
    assert s.waiting == 0


def test_good_parameters_travel_from_the_request_to_the_join():
    from deployments.wire.generation import generate_request

    assert check_sampling() == (0.0, 1.0, None)  # absent: greedy
    assert check_sampling(2, 1e-9, 2**63 - 1) == (2.0, 1e-9, 2**63 - 1)
    r = generate_request(1, "p", {"temperature": 1, "top_p": 0.5, "seed": 0})
    assert (r.temperature, r.top_p, r.seed) == (1.0, 0.5, 0)
    r = generate_request(1, "p", {"temperature": None, "seed": None})
    assert (r.temperature, r.top_p, r.seed) == (0.0, 1.0, None)
    with pytest.raises(InvalidRequest, match=r"\['top_k'\]: generate takes .*'seed'") as e:
        generate_request(1, "p", {"top_k": 3})
    assert "greedily" not in str(e.value)
    s = IterativeScheduler(IterativePolicy())
    s.add_replica("r0")
    s.submit(GenerateRequest("a", "hi", 5, temperature=0.8, top_p=0.9, seed=3), now=0.0)
    [join] = s.next_step(0.0, "r0").join
    assert join == Join("a", "hi", 5, (), 0.8, 0.9, 3)
    assert pickle.loads(pickle.dumps(join)) == join  # it crosses Ray


# -- determinism --------------------------------------------------------------------------
@pytest.mark.parametrize("logits_as", ["numpy", "torch"])
def test_a_seeded_sequence_gives_the_same_tokens_whatever_shares_its_batch(logits_as):
    model = Table(logits_as)
    x = sampled("x", "ab", t=0.9, p=0.95, seed=11)
    alone = generate(model, [[x]])["x"]
    others = [sampled("o1", "cd", 5, seed=1), Join("g", "ef", 30, ()),
              sampled("o2", "ab", 40, t=1.7, p=0.5, seed=11 + 1), sampled("o3", "zz", 2)]
    for schedule in ([[x, *others]], [[*others, x]], [others[:2], [x], others[2:]],
                     [[others[3]], [others[2], x], [], [others[0], others[1]]]):
        got = generate(model, schedule)
        assert got["x"] == alone, schedule
        assert got["g"] == generate(Table(), [[Join("g", "ef", 30, ())]])["g"]  # greedy row
    assert len(alone[0]) == 24 and alone[1] == "length"
    assert generate(model, [[sampled("x", "ab", t=0.9, p=0.95, seed=12)]])["x"] != alone


def test_each_sampled_token_takes_exactly_one_draw_of_its_own_rng():
    model = Table()
    got = generate(model, [[sampled("x", "ab", n=10, t=1.3, p=0.8, seed=5)]])["x"][0]
    rng, last, want = np.random.Generator(np.random.PCG64(5)), 1, []
    for _ in range(10):
        [token], _ = sample_rows(TABLE[[last]], np.array([1.3]), np.array([0.8]),
                                 np.array([rng.random()]))
        want.append(int(token))
        last = int(token)
    assert got == model.decode(want)


def test_temperature_zero_and_a_tiny_top_p_decode_greedily():
    greedy_model = Table()
    greedy = generate(greedy_model, [[Join("x", "ab", 20, ())]])["x"]
    assert greedy_model.calls == {"step": 20}  # greedy-only steps keep the plain step
    m = Table()
    assert generate(m, [[Join("x", "ab", 20, (), 0.0, 0.3, 99)]])["x"] == greedy
    assert m.calls == {"step": 20}
    for t in (0.5, 2.0):
        m = Table()
        assert generate(m, [[sampled("x", "ab", 20, t=t, p=1e-9, seed=3)]])["x"] == greedy
        assert m.calls == {"step_logits": 20}


def test_ties_are_broken_by_the_lowest_token_id():
    logits = np.array([[0.0, 3.0, 1.0, 3.0], [3.0, 3.0, 3.0, 3.0]])
    tokens, bad = sample_rows(logits, np.array([1.0, 1.0]), np.array([1e-9, 1e-9]),
                              np.array([0.99, 0.99]))
    assert tokens.tolist() == [1, 0] and not bad.any()
    tokens, _ = sample_rows(logits, np.ones(2), np.ones(2), np.array([0.0, 0.3]))
    assert tokens.tolist() == [1, 1]  # sorted 1, 3, 2, 0; then 0, 1, 2, 3 (each 1/4)


def test_different_seeds_give_different_sequences_on_a_flat_distribution():
    model = Fixed([1.0] * V)
    texts = {generate(model, [[sampled(s, "a", 20, seed=s)]])[s][0] for s in range(8)}
    assert len(texts) == 8
    unseeded = [generate(model, [[sampled("u", "a", 20, seed=None)]])["u"][0] for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # a fresh seed per request: 16**20 texts


# -- the distribution ---------------------------------------------------------------------
PROBS = [0.5, 0.25, 0.15, 0.1]


@pytest.mark.parametrize("t, p, want", [
    (1.0, 1.0, PROBS),
    (0.5, 1.0, np.square(PROBS) / np.square(PROBS).sum()),  # p ** (1 / t), normalised
    (2.0, 1.0, np.sqrt(PROBS) / np.sqrt(PROBS).sum()),
    (1.0, 0.8, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0]),  # 0.5 + 0.25 < 0.8 <= 0.9
    (1.0, 0.7, [2 / 3, 1 / 3, 0.0, 0.0]),
    (1.0, 0.3, [1.0, 0.0, 0.0, 0.0]),
])
def test_draws_follow_the_tempered_nucleus_distribution(t, p, want):
    """4000 sequences of one token each, seeds 0..3999 (fixed: this cannot flake); each
    frequency within 0.03 of its probability (about 4 standard deviations)."""
    n = 4000
    got = generate(Fixed(PROBS), [[sampled(i, "a", 1, t=t, p=p, seed=i) for i in range(n)]])
    counts = Counter(text for text, _ in got.values())
    freqs = [counts["abcd"[k]] / n for k in range(4)]
    assert np.allclose(freqs, want, atol=0.03), freqs
    assert all(f == 0 for f, w in zip(freqs, want) if w == 0)  # outside the nucleus: never


# -- failures of one sequence -------------------------------------------------------------
def test_a_model_without_logits_refuses_sampling_for_that_sequence_only():
    model = Greedy()
    gen = Generator(model)
    assert not gen.can_sample and Generator(Table()).can_sample
    outs = gen.step([Join("g", "ab", 3, ()), sampled("s", "ab", 3, t=0.7)], [])
    refused = next(o for o in outs if o.id == "s")
    assert (refused.text, refused.finished, refused.tokens) == ("", "error", 0)
    assert isinstance(refused.error, InvalidRequest)
    assert str(refused.error) == ("Greedy decodes greedily only (it has no step_logits), so it "
                                  "cannot sample with temperature=0.7: send temperature 0 or "
                                  "leave it out")
    assert pickle.loads(pickle.dumps(refused)).error.args == refused.error.args
    assert [o.id for o in outs] == ["s", "g"] and gen.live == 1 and not gen.holds("s")
    assert generate(Greedy(), [[Join("g", "ab", 3, ()), sampled("s", "ab", 3)]])["g"] == \
        generate(Table(), [[Join("g", "ab", 3, ())]])["g"]


def test_logits_without_a_distribution_fail_that_sampled_sequence_only():
    ok, g = sampled("ok", "a", 5, seed=1), Join("g", "a", 5, ())
    fine = generate(Table(), [[ok, g]])
    poison = next(c for c in "abcdefghijklmnop" if c not in "a" + fine["ok"][0] + fine["g"][0])

    class Broken(Table):
        def logits(self, states):  # NaN after the poison token, which only "bad" reads
            rows = TABLE[states].copy()
            rows[np.array(states) == self.encode(poison)[0]] = np.nan
            return rows

    got = generate(Broken(), [[sampled("bad", poison, 5), ok, g]])
    text, error = got["bad"]
    assert text == "" and isinstance(error, ModelError)
    assert "request 'bad'" in str(error) and "NaN" in str(error)
    assert got["ok"] == fine["ok"] and got["g"] == fine["g"]
    for row in ([-math.inf] * 3, [0.0, math.inf, 0.0]):
        _, bad = sample_rows(np.array([row]), np.ones(1), np.ones(1), np.zeros(1))
        assert bad.tolist() == [True]


def test_the_scheduler_ends_a_failed_sequence_and_counts_it_failed():
    s = IterativeScheduler(IterativePolicy())
    s.add_replica("r0")
    for rid in ("a", "b"):
        s.submit(GenerateRequest(rid, "hi", 5), now=0.0)
    step = s.next_step(0.0, "r0")
    error = InvalidRequest("no")
    live = s.complete(step.id, [StepOutput("a", "", "error", 0, error),
                                StepOutput("b", "x", None)], now=0.1)
    assert [o.id for o in live] == ["a", "b"] and live[0].error is error
    assert s.active == 1 and s.stats.failed == 1 and not s.stats.finished
    assert s.next_step(0.1, "r0").leave == ()  # the replica dropped it already


def test_logits_of_the_wrong_shape_fail_loudly():
    with pytest.raises(BatchSizeMismatch, match=r"shape \(1, 4\) for 2 sequences"):
        Chooser([None, SeqSampler.of(1.0, 1.0, 0)])(np.zeros((1, 4)))
