"""The generative model interface (`StepModel`) and the replica-side `Generator`.

A `StepModel` sees whole steps: `prefill(prompts)` turns each prompt into a
state (the KV cache of all but its last token, with that token pending),
`step(states)` computes the greedy next token of every state at once and feeds
it in. The `Generator` keeps the per-sequence states of one replica between
steps, and turns tokens into text: each `step(join, leave)` frees `leave`,
prefills `join`, runs ONE model step over every live sequence (a joining one
gets its first token in the step it joins) and answers one `StepOutput` per
live sequence.

Sampling (temperature > 0): a model that can sample also has
`step_logits(states, choose)`, the same step with the next tokens picked by
`choose(logits)` (`sampling.Chooser`: argmax for greedy rows, a draw of the
sequence's own RNG for sampled ones). The Generator calls it only for a step
where some live sequence samples, so greedy-only steps keep the plain `step`.
One sequence fails alone (a `StepOutput` with `finished="error"` and `error`;
the others go on) when it asks a model without `step_logits` to sample
(InvalidRequest), or when its logits hold no distribution (ModelError).

Where a sequence ends, in this order: the eos token ("eos", never shown); a
stop string appearing in the text ("stop", the text is cut before it); its
`max_tokens`-th token, or prompt + generated tokens reaching the model's
`max_context` ("length"). A finished sequence is dropped here, as it is
reported: the scheduler never lists it in `leave`, and a `leave` of an unknown
id is ignored. A step that raises drops every sequence (they all ran in it).
Text is decoded incrementally (a window of tokens, not the whole sequence)
and held back while its end could still be the start of a stop string, or is
half a character (U+FFFD), so a client never sees a stop string or a broken
character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from batching.errors import BatchSizeMismatch, InvalidRequest, ModelError
from batching.iterative.sampling import Chooser, SeqSampler
from batching.iterative.scheduler import Join, StepOutput
from batching.types import RequestId


class StepModel:
    """Base class of models decoded one token per step, for many sequences at once.

    >>> class Count(StepModel):  # each next token is the last one + 1
    ...     def encode(self, text): return [ord(c) for c in text]
    ...     def decode(self, tokens): return "".join(map(chr, tokens))
    ...     def prefill(self, prompts): return [p[-1] for p in prompts]
    ...     def step(self, states): return [s + 1 for s in states], [s + 1 for s in states]
    >>> [o.text for o in Generator(Count()).step([Join("a", "ab", 4, ())], [])]
    ['c']
    """

    eos_id: int | None = None
    """Token that ends a sequence ("eos"); None: the model has none."""
    max_context: int | None = None
    """Most tokens (prompt + generated) a sequence may hold; None: unbounded."""
    device: str = "cpu"

    def setup(self, device: str) -> None:
        """Called once before the first step, with "cpu" or "cuda:N"."""
        self.device = device

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement encode(text)")

    def decode(self, tokens: list[int]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement decode(tokens)")

    @staticmethod
    def count_tokens(text: str) -> int:
        """Tokens of `text`, for the scheduler's budget, without loading the model."""
        return len(text)

    def prefill(self, prompts: list[list[int]]) -> list[Any]:
        """One state per prompt (every prompt has at least one token), batched."""
        raise NotImplementedError(f"{type(self).__name__} must implement prefill(prompts)")

    def step(self, states: list[Any]) -> tuple[list[int], list[Any]]:
        """The greedy next token of every state, and the states with it fed in. The states
        passed are consumed (they may be updated in place)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(states)")

    def step_logits(self, states: list[Any],
                    choose: Callable[[Any], list[int]]) -> tuple[list[int], list[Any]]:
        """Optional (a model without it decodes greedily only): `step`, but the next
        tokens are `choose(logits)`, `logits` [len(states), vocabulary] (numpy or torch,
        row i for states[i]); returns those tokens and the states with them fed in."""
        raise NotImplementedError(f"{type(self).__name__} has no step_logits: it cannot "
                                  "sample")


@dataclass(slots=True, eq=False)
class _Live:
    join: Join
    state: Any
    length: int  # tokens the sequence holds: prompt + generated
    sampler: SeqSampler | None = None  # None: greedy
    tokens: list[int] = field(default_factory=list)  # generated, eos excluded
    text: str = ""  # decode(tokens[:read])
    sent: int = 0  # characters of `text` already answered
    prefix: int = 0  # tokens[prefix:read] are decoded again as the context of new ones
    read: int = 0  # tokens whose text is in `text`

    def detokenize(self, decode: Any, final: bool = False) -> None:
        """Extend `text` with what the new tokens spell (vLLM's incremental detokenizing:
        decode a short window, not the whole sequence). A half character (U+FFFD at the
        end) waits for the next token, unless `final`."""
        before = decode(self.tokens[self.prefix:self.read])
        window = decode(self.tokens[self.prefix:])
        if final or (len(window) > len(before) and not window.endswith("\ufffd")):
            self.text += window[len(before):]
            self.prefix, self.read = self.read, len(self.tokens)


class Generator:
    """The per-sequence states of one replica, advanced one step at a time."""

    def __init__(self, model: StepModel) -> None:
        self.model = model
        self.can_sample = type(model).step_logits is not StepModel.step_logits
        self._seqs: dict[RequestId, _Live] = {}  # join order = output order

    @property
    def live(self) -> int:
        return len(self._seqs)

    def holds(self, request_id: RequestId) -> bool:
        return request_id in self._seqs

    def step(self, join: Sequence[Join], leave: Sequence[RequestId]) -> list[StepOutput]:
        """Free `leave`, prefill `join`, advance every live sequence by one token."""
        for rid in leave:
            self._seqs.pop(rid, None)
        dup = [j.id for j in join if j.id in self._seqs]
        if dup or len({j.id for j in join}) != len(join):
            raise ValueError(f"step joins sequences that are live or joined twice: {dup}")
        try:
            outputs = self._join(join)
            if self._seqs:
                outputs += self._advance()
        except BaseException:
            self._seqs.clear()  # every live sequence ran in the failed step
            raise
        return outputs

    def _join(self, join: Sequence[Join]) -> list[StepOutput]:
        """Prefill the joining sequences; those that cannot run end at once."""
        ctx = self.model.max_context
        done, fit = [], []
        for j in join:
            ids = self.model.encode(j.prompt)
            if not ids or (ctx is not None and len(ids) >= ctx):
                done.append(StepOutput(j.id, "", "length", 0))  # no room for one token
            elif j.temperature > 0 and not self.can_sample:
                done.append(StepOutput(j.id, "", "error", 0, InvalidRequest(
                    f"{type(self.model).__name__} decodes greedily only (it has no "
                    f"step_logits), so it cannot sample with temperature={j.temperature}: "
                    "send temperature 0 or leave it out")))
            else:
                fit.append((j, ids))
        if fit:
            states = self.model.prefill([ids for _, ids in fit])
            _check_count("prefill", len(fit), len(states))
            for (j, ids), state in zip(fit, states):
                sampler = SeqSampler.of(j.temperature, j.top_p, j.seed)
                self._seqs[j.id] = _Live(j, state, len(ids), sampler)
        return done

    def _advance(self) -> list[StepOutput]:
        live = list(self._seqs.values())
        samplers = [s.sampler for s in live]
        bad: Sequence[int] = ()
        if any(samplers):
            choose = Chooser(samplers)
            tokens, states = self.model.step_logits([s.state for s in live], choose)
            bad = choose.bad
        else:  # greedy only: the plain step, no logits leave the model
            tokens, states = self.model.step([s.state for s in live])
        _check_count("step", len(live), len(tokens), len(states))
        outputs = []
        for s, token, state in zip(live, tokens, states):
            s.state = state
            out = self._emit(s, int(token))
            if out.finished is not None:
                del self._seqs[s.join.id]
            outputs.append(out)
        for i in bad:  # after _emit: an error replaces whatever it answered
            outputs[i] = self._fail(live[i], ModelError(
                f"{type(self.model).__name__} gave logits holding no distribution (NaN, "
                f"+inf, or all -inf) to sample request {live[i].join.id!r} from: the "
                "model is at fault"))
        return outputs

    def _fail(self, s: _Live, error: BaseException) -> StepOutput:
        self._seqs.pop(s.join.id, None)
        return StepOutput(s.join.id, "", "error", 1, error)

    def _emit(self, s: _Live, token: int) -> StepOutput:
        """Apply one new token to `s`: what text it releases, and whether `s` ends."""
        rid, stops, decode = s.join.id, s.join.stop, self.model.decode
        s.length += 1
        if token == self.model.eos_id:
            return self._finish(s, "eos")
        s.tokens.append(token)
        s.detokenize(decode)
        cut = _first_stop(s.text, stops, s.sent)
        if cut is not None:
            return StepOutput(rid, self._release(s, cut), "stop")
        ctx = self.model.max_context
        if len(s.tokens) >= s.join.max_tokens or (ctx is not None and s.length >= ctx):
            return self._finish(s, "length")
        return StepOutput(rid, self._release(s, len(s.text) - _held_back(s.text, stops, s.sent)),
                          None)

    def _finish(self, s: _Live, reason: str) -> StepOutput:
        """End `s`: flush what its decoder held (half characters), release the rest."""
        s.detokenize(self.model.decode, final=True)
        cut = _first_stop(s.text, s.join.stop, s.sent)  # the flushed rest may hold a stop
        if cut is not None:
            return StepOutput(s.join.id, self._release(s, cut), "stop")
        return StepOutput(s.join.id, self._release(s, len(s.text)), reason)

    @staticmethod
    def _release(s: _Live, upto: int) -> str:
        new = s.text[s.sent:upto]
        s.sent = max(s.sent, upto)
        return new


def _first_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Where the earliest stop string in `text[start:]` begins, or None. Text before
    `start` was released, so no stop string can begin there."""
    found = [i for i in (text.find(stop, start) for stop in stops) if i >= 0]
    return min(found) if found else None


def _held_back(text: str, stops: Sequence[str], start: int) -> int:
    """How many characters at the end of `text` (after `start`) to hold back: the longest
    end that is the beginning of a stop string. Only ends that begin with a stop's first
    character are compared (found by `str.find`, longest first)."""
    hold, room, n = 0, len(text) - start, len(text)
    for stop in stops:
        i = text.find(stop[0], n - min(len(stop) - 1, room))
        while i != -1 and n - i > hold:
            if stop.startswith(text[i:]):
                hold = n - i
                break
            i = text.find(stop[0], i + 1)
    return min(hold, room)


def _check_count(what: str, expected: int, *got: int) -> None:
    if any(n != expected for n in got):
        raise BatchSizeMismatch(f"model.{what} answered {list(got)} items for {expected} "
                                "sequences: one per sequence")
