"""Generator with a scripted StepModel: one token per step, stop strings held back and cut,
max_tokens, eos, the context, half-decoded characters, leave, and failures."""

from __future__ import annotations

import pytest

from batching.errors import BatchSizeMismatch
from batching.iterative.generative import Generator, StepModel
from batching.iterative.scheduler import Join, StepOutput

EOS = 0


class Script(StepModel):
    """Each prompt continues with SCRIPTS[prompt] one character per step, then eos.
    A state is (script, position); the token of a character is its code point."""

    eos_id = EOS

    def __init__(self, scripts: dict[str, str], max_context: int | None = None) -> None:
        self.scripts = scripts
        self.max_context = max_context
        self.prefills: list[list[list[int]]] = []
        self.batch_sizes: list[int] = []
        self.fail_next = False

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, tokens):
        return "".join(map(chr, tokens))

    def prefill(self, prompts):
        self.prefills.append(prompts)
        return [(self.scripts[self.decode(p)], 0) for p in prompts]

    def step(self, states):
        self.batch_sizes.append(len(states))
        if self.fail_next:
            raise RuntimeError("the model broke")
        tokens = [ord(s[i]) if i < len(s) else EOS for s, i in states]
        return tokens, [(s, i + 1) for s, i in states]


def run(gen: Generator, join: list[Join] = (), leave=()) -> dict:
    return {o.id: (o.text, o.finished) for o in gen.step(list(join), list(leave))}


def texts(gen: Generator, rid, steps: int) -> list[tuple[str, str | None]]:
    return [run(gen)[rid] for _ in range(steps)]


def test_a_joining_sequence_gets_its_first_token_in_the_step_it_joins():
    m = Script({"p": "hi", "q": "yo!"})
    g = Generator(m)
    assert run(g, [Join("a", "p", 10, ())]) == {"a": ("h", None)}
    assert run(g, [Join("b", "q", 10, ())]) == {"a": ("i", None), "b": ("y", None)}
    assert m.batch_sizes == [1, 2] and m.prefills == [[[ord("p")]], [[ord("q")]]]
    assert run(g) == {"a": ("", "eos"), "b": ("o", None)}
    assert g.live == 1 and not g.holds("a")  # finished: dropped here, never in `leave`
    assert run(g) == {"b": ("!", None)}
    assert run(g) == {"b": ("", "eos")} and g.live == 0


def test_text_that_may_start_a_stop_string_is_held_back_then_released_or_cut():
    g = Generator(Script({"p": "wow world!"}))
    run(g, [Join("a", "p", 20, ("world",))])  # "w" could start "world": held
    assert texts(g, "a", 8) == [("", None), ("wo", None), ("w ", None), ("", None),
                                ("", None), ("", None), ("", None), ("", "stop")]


def test_the_earliest_stop_string_wins_and_is_not_included():
    g = Generator(Script({"p": "abcdef"}))
    out = [run(g, [Join("a", "p", 20, ("de", "cd"))])["a"], *texts(g, "a", 3)]
    assert out == [("a", None), ("b", None), ("", None), ("", "stop")]
    assert "".join(t for t, _ in out) == "ab"


def test_max_tokens_ends_with_length_and_flushes_held_text():
    g = Generator(Script({"p": "abcdef"}))
    out = [run(g, [Join("a", "p", 3, ("cx",))])["a"], *texts(g, "a", 2)]
    assert out == [("a", None), ("b", None), ("c", "length")]  # "c" was never a stop


def test_eos_ends_the_sequence_flushes_held_text_and_adds_none():
    g = Generator(Script({"p": "xa"}))
    out = [run(g, [Join("a", "p", 9, ("ab",))])["a"], *texts(g, "a", 2)]
    assert out == [("x", None), ("", None), ("a", "eos")]


def test_a_sequence_ends_with_length_when_it_fills_the_context():
    g = Generator(Script({"pp": "abcdef", "q" * 4: "z"}, max_context=4))
    assert run(g, [Join("a", "pp", 9, ()), Join("b", "q" * 4, 9, ())]) == {
        "b": ("", "length"), "a": ("a", None)}  # b's prompt fills it: no room for a token
    assert run(g) == {"a": ("b", "length")}  # 2 prompt + 2 generated = 4


def test_half_decoded_characters_are_held_back():
    class Bytes(Script):
        def decode(self, tokens):
            return bytes(tokens).decode("utf-8", errors="replace")

    g = Generator(Bytes({"p": "".join(map(chr, "é!".encode()))}))  # é is 2 tokens (bytes)
    out = [run(g, [Join("a", "p", 9, ())])["a"], *texts(g, "a", 2)]
    assert out == [("", None), ("é", None), ("!", None)]
    assert run(g, [Join("b", "p", 1, ())])["b"] == ("\ufffd", "length")  # flushed at the end


def test_leave_frees_state_and_unknown_ids_are_ignored():
    g = Generator(Script({"p": "abcdef", "q": "uvwxyz"}))
    run(g, [Join("a", "p", 9, ()), Join("b", "q", 9, ())])
    assert run(g, leave=["a", "never-joined"]) == {"b": ("v", None)}
    assert g.live == 1
    with pytest.raises(ValueError, match="live or joined twice"):
        g.step([Join("b", "p", 9, ())], [])
    assert g.live == 1  # a refused step changes nothing


def test_a_failing_model_step_drops_every_sequence_and_raises():
    m = Script({"p": "abc"})
    g = Generator(m)
    run(g, [Join("a", "p", 9, ())])
    m.fail_next = True
    with pytest.raises(RuntimeError, match="the model broke"):
        g.step([Join("b", "p", 9, ())], [])
    assert g.live == 0


def test_a_model_answering_the_wrong_count_fails_loudly():
    class Short(Script):
        def step(self, states):
            tokens, new = super().step(states)
            return tokens[:-1], new

    g = Generator(Short({"p": "abc"}))
    with pytest.raises(BatchSizeMismatch, match=r"model.step answered \[1, 2\] items for 2"):
        g.step([Join("a", "p", 9, ()), Join("b", "p", 9, ())], [])


def test_outputs_are_step_outputs_with_one_token_each():
    g = Generator(Script({"p": "ab"}))
    assert g.step([Join("a", "p", 9, ())], []) == [StepOutput("a", "a", None, 1)]


def _held_back_by_every_end(text: str, stops, start: int) -> int:
    """What `_held_back` must answer: every end of the unsent text compared, longest first."""
    hold, room = 0, len(text) - start
    for stop in stops:
        for k in range(min(len(stop) - 1, room), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return min(hold, room)


def test_the_held_back_end_is_the_one_every_comparison_finds():
    """`_held_back` compares only the ends that begin with a stop's first character: on
    random texts and stops of few letters (many partial matches), the same answer as
    comparing every end."""
    import random

    from batching.iterative.generative import _held_back

    rng = random.Random(5)
    for _ in range(20_000):
        text = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 12)))
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 6)))
                 for _ in range(rng.randint(0, 3))]
        start = rng.randint(0, len(text))
        assert _held_back(text, stops, start) == _held_back_by_every_end(text, stops, start), (
            text, stops, start)
