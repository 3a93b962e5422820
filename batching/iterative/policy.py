"""Iterative-batching settings a user writes: validated once, at the edge.

`IterativePolicy` says how a generative model's sequences share a replica's
steps (vLLM's scheduler settings: `max_num_seqs` is `max_active`,
`max_num_batched_tokens` is `max_step_tokens`), how long an answer may be, and
how the waiting queue is served (priority levels and join deadlines, as in
dynamic batching). Messages name the value and the fix, because these come
from YAML files and CLI flags.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from batching.errors import InvalidRequest

# Stop strings are looked for in each sequence's new text at every step, on the host that
# steps every sequence of the model: their count and length bound that work, so that one
# request cannot slow every other sequence's steps (vLLM sets no bound; OpenAI allows 4).
MAX_STOPS = 16
MAX_STOP_CHARS = 256


class Prompted(Protocol):
    """What the policy reads of a generation request (`GenerateRequest` has it)."""

    id: object
    prompt: object
    stop: tuple[str, ...]
    prompt_tokens: int


class IterativePolicy(BaseModel):
    """How the sequences of a generative model are scheduled, one step at a time.

    >>> IterativePolicy(max_active=8, max_step_tokens=512).max_active
    8
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["iterative"] = "iterative"
    """Which scheduler: dynamic (stateless), sequence (stateful) or iterative (generative)."""
    max_active: int = Field(default=32, ge=1)
    """Sequences one replica advances per step (its batch size while decoding)."""
    max_step_tokens: int = Field(default=2048, ge=1)
    """Token budget of one step: 1 per decoding sequence plus the prompt tokens of the
    sequences joining in that step. A longer prompt is refused; one that does not fit
    beside the decoding sequences waits (nothing behind it jumps ahead)."""
    max_tokens_default: int = Field(default=64, ge=1)
    """Most tokens generated for a request that names no `max_tokens`."""
    max_tokens_limit: int = Field(default=1024, ge=1)
    """Most tokens a request may ask for; asking more is refused (400)."""
    priority_levels: int = Field(default=1, ge=1)
    """Number of priority levels; 1 is the highest."""
    default_priority_level: int | None = Field(default=None, ge=1)
    """Level of a request that names none; None means the lowest level."""
    max_queue_size: int | None = Field(default=None, ge=1)
    """Requests that may wait to join (all levels together); one more is refused with
    QueueFull. None: unbounded."""
    default_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds a request may wait to join (start generating) when it names no timeout;
    a request's own timeout may only lower it. None: forever."""
    schedule: Literal["continuous", "lockstep"] = "continuous"
    """continuous: sequences join and leave at every step boundary. lockstep: a replica
    admits new sequences only when its active set is empty, so a batch runs until all its
    members finish (Ray Serve's @serve.batch with generators); for comparison."""

    @model_validator(mode="after")
    def _consistent(self) -> IterativePolicy:
        if self.max_tokens_default > self.max_tokens_limit:
            raise ValueError(
                f"max_tokens_default={self.max_tokens_default} exceeds max_tokens_limit="
                f"{self.max_tokens_limit}: lower the default or raise the limit"
            )
        if self.max_step_tokens < self.max_active:
            raise ValueError(
                f"max_step_tokens={self.max_step_tokens} is below max_active={self.max_active}: "
                "a step of max_active decoding sequences costs max_active tokens, so raise "
                "max_step_tokens or lower max_active"
            )
        levels = self.priority_levels
        if self.default_priority_level is not None and self.default_priority_level > levels:
            raise ValueError(
                f"default_priority_level={self.default_priority_level} is out of range: "
                f"priority_levels={levels}, so use 1..{levels}"
            )
        return self

    @property
    def default_level(self) -> int:
        return self.default_priority_level or self.priority_levels

    # -- one request's settings, checked against this policy (InvalidRequest: a 400) -------
    def level_of(self, priority: int | None) -> int:
        """The priority level of a request; None or 0 is the default level."""
        levels = self.priority_levels
        if not priority:
            return self.default_level
        if not 1 <= priority <= levels:
            raise InvalidRequest(
                f"priority={priority} is out of range: this model has priority_levels={levels} "
                f"(1 = highest), so send 1..{levels} or leave it out")
        return priority

    def max_tokens_of(self, max_tokens: int | None) -> int:
        limit = self.max_tokens_limit
        if max_tokens is None:
            return self.max_tokens_default
        if not 1 <= max_tokens <= limit:
            raise InvalidRequest(f"max_tokens={max_tokens} is out of range: ask for 1..{limit} "
                                 "(the model's max_tokens_limit)")
        return max_tokens

    def prompt_tokens_of(self, request: Prompted) -> int:
        """The prompt's tokens (`prompt_tokens`, or its length when not counted)."""
        if not request.prompt:
            raise InvalidRequest(f"request {request.id!r} has an empty prompt: send some text")
        if any(not stop for stop in request.stop):
            raise InvalidRequest(f"request {request.id!r} has an empty stop string: drop it")
        if len(request.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in request.stop):
            raise InvalidRequest(
                f"request {request.id!r} has {len(request.stop)} stop "
                f"string{'' if len(request.stop) == 1 else 's'}, the longest "
                f"of {max(map(len, request.stop))} characters: send at most {MAX_STOPS}, each "
                f"of at most {MAX_STOP_CHARS} characters")
        n = request.prompt_tokens if request.prompt_tokens >= 0 else len(request.prompt)
        if n > self.max_step_tokens:
            raise InvalidRequest(
                f"the prompt has {n} tokens, more than max_step_tokens={self.max_step_tokens}: "
                "shorten it or raise max_step_tokens")
        return max(n, 1)

    def timeout_of(self, timeout_s: float | None) -> float:
        """Seconds a request may wait to join; math.inf for no deadline."""
        default_s = self.default_timeout_s or math.inf
        if timeout_s is None:
            return default_s
        if not timeout_s > 0:
            raise InvalidRequest(f"timeout_s={timeout_s} must be > 0 seconds")
        return min(default_s, timeout_s)
