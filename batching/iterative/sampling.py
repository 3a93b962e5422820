"""Sampling the next token: `temperature`, `top_p` (nucleus) and `seed`, per sequence.

What it decides: the next token of a sampled row is drawn from softmax(logits /
temperature) restricted to the top-p set (the fewest most likely tokens whose
probabilities sum to >= top_p), by inverse CDF over that set sorted by
probability descending, then token id. Temperature 0 is greedy (argmax, no draw).

The invariant: a sequence's tokens depend on (its logits, temperature, top_p,
seed) only, never on the other rows of its batch, their order or its own row.
So each sequence owns its RNG (`numpy` PCG64 seeded by `seed`, or by fresh entropy
when it names none) and draws exactly one uniform per sampled token; the
arithmetic (softmax, sort, cumsum) is vectorised over the batch's sampled rows,
but every operation is row-wise in float64, and the tie order is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batching.errors import BatchSizeMismatch, InvalidRequest

MAX_TEMPERATURE = 2.0  # OpenAI's range: 0..2
SEED_LIMIT = 2**63  # seeds are 0 <= seed < 2**63 (a signed 64-bit integer)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_sampling(temperature: Any = None, top_p: Any = None,
                   seed: Any = None) -> tuple[float, float, int | None]:
    """The sampling parameters checked, as (temperature, top_p, seed); None means the
    default (greedy, 1, a fresh seed). Raises InvalidRequest saying what to send.

    >>> check_sampling(0.7, 0.9, 42)
    (0.7, 0.9, 42)
    >>> check_sampling(temperature=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    batching.errors.InvalidRequest: parameter 'temperature' is 3, out of range: send a number...
    """
    if temperature is None:
        temperature = 0.0
    if not _is_number(temperature):
        raise InvalidRequest(f"parameter 'temperature' must be a number from 0 to 2 "
                             f"(0 decodes greedily), got {temperature!r}")
    if not 0 <= temperature <= MAX_TEMPERATURE:  # NaN fails too
        raise InvalidRequest(f"parameter 'temperature' is {temperature!r}, out of range: send "
                             f"a number from 0 to 2 (0 decodes greedily)")
    if top_p is None:
        top_p = 1.0
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise InvalidRequest(f"parameter 'top_p' must be a number above 0 and at most 1 (the "
                             f"probability mass of the likeliest tokens kept; 1 keeps them "
                             f"all), got {top_p!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed < SEED_LIMIT):
        raise InvalidRequest(f"parameter 'seed' must be an integer from 0 to 2**63 - 1, "
                             f"got {seed!r}: send one, or leave it out for a fresh seed")
    return float(temperature), float(top_p), seed


@dataclass(slots=True, eq=False)
class SeqSampler:
    """How one sequence samples: its temperature, top_p and its own RNG."""

    temperature: float
    top_p: float
    rng: np.random.Generator

    @classmethod
    def of(cls, temperature: float, top_p: float, seed: int | None) -> SeqSampler | None:
        """The sampler of a sequence, or None for a greedy one (temperature 0)."""
        if temperature == 0:
            return None
        return cls(temperature, top_p, np.random.Generator(np.random.PCG64(seed)))


def sample_rows(logits: np.ndarray, temperature: np.ndarray, top_p: np.ndarray,
                u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token per row of `logits` [rows, vocab] (float64), given each row's
    temperature (> 0), top_p and uniform draw `u` in [0, 1); and which rows had no
    distribution (a NaN or +inf logit, or every logit -inf: their token is meaningless).

    >>> logits = np.log(np.array([[0.5, 0.3, 0.2]]))
    >>> one = np.ones(1)
    >>> [int(sample_rows(logits, one, one, np.array([u]))[0][0]) for u in (0.1, 0.6, 0.9)]
    [0, 1, 2]
    >>> int(sample_rows(logits, np.ones(1), np.array([0.7]), np.array([0.9]))[0][0])  # {0, 1}
    1
    """
    rows = np.arange(len(logits))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN rows are flagged below
        # Subtract the row's max before dividing: a tiny temperature cannot overflow.
        p = np.exp((logits - logits.max(axis=1, keepdims=True)) / temperature[:, None])
        p /= p.sum(axis=1, keepdims=True)
    bad = ~np.isfinite(p).all(axis=1)
    if bad.any():  # a placeholder distribution; the caller ends these rows' sequences
        p[bad] = 0.0
        p[bad, 0] = 1.0
    order = np.argsort(-p, axis=1, kind="stable")  # likeliest first; ties: lowest id first
    c = np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    # The last kept position: the first whose cumulative mass reaches top_p (the last
    # token when rounding keeps the sum below 1).
    last = np.minimum((c < top_p[:, None]).sum(axis=1), p.shape[1] - 1)
    # Inverse CDF in the kept set: c[last] > u * c[last] >= every c before the pick,
    # so the pick is in the set and never a token of probability 0.
    pick = (c <= (u * c[rows, last])[:, None]).sum(axis=1)
    return order[rows, pick], bad


def _float64(x: Any) -> np.ndarray:
    """Logits as a float64 numpy array (a torch tensor is copied to the host)."""
    if hasattr(x, "detach"):  # torch, without importing it
        x = x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


class Chooser:
    """`choose(logits)` for `StepModel.step_logits`: the next token of every row, argmax
    for greedy rows (None in `samplers`), a draw for the others. `bad` lists the rows
    whose logits held no distribution (their sequences end with an error).

    >>> c = Chooser([None, SeqSampler.of(1.0, 1e-9, seed=7)])
    >>> c(np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]]))  # top_p tiny: argmax too
    [1, 0]
    """

    def __init__(self, samplers: Sequence[SeqSampler | None]) -> None:
        self.samplers = samplers
        self.rows = [i for i, s in enumerate(samplers) if s is not None]
        self.bad: list[int] = []

    def __call__(self, logits: Any) -> list[int]:
        if not hasattr(logits, "argmax"):
            logits = np.asarray(logits, dtype=np.float64)
        n = len(self.samplers)
        if logits.ndim != 2 or logits.shape[0] != n:
            raise BatchSizeMismatch(f"model.step_logits gave logits of shape "
                                    f"{tuple(logits.shape)} for {n} sequences: "
                                    f"[{n}, vocabulary] expected")
        tokens = logits.argmax(-1).tolist()  # numpy's axis, torch's dim: both first ties
        if not self.rows:
            return tokens
        rows = self.rows
        mine = [self.samplers[i] for i in rows]
        sub = _float64(logits if len(rows) == n else logits[rows])
        picked, bad = sample_rows(sub, np.array([s.temperature for s in mine]),
                                  np.array([s.top_p for s in mine]),
                                  np.array([s.rng.random() for s in mine]))  # one draw each
        for i, token, failed in zip(rows, picked.tolist(), bad.tolist()):
            tokens[i] = token
            if failed:
                self.bad.append(i)
        return tokens
