"""Sequence-batching settings a user writes: validated once, at the edge.

`SequencePolicy` mirrors Triton's `sequence_batching` block for stateful
models. A replica holds `sequences_per_replica` live sequences, each with its
state; a sequence's requests always go to the replica holding its state.
`direct` gives each live sequence a fixed slot (a batch row) on its replica;
`oldest` keeps `max_candidate_sequences` live per replica and batches the
oldest ready requests among them, with preferred sizes and a queue delay like
dynamic batching. Messages name the value and the fix, because these come from
YAML files and CLI flags.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batching.sizes import check_preferred_fit, sorted_sizes


class SequenceStrategy(str, enum.Enum):
    DIRECT = "direct"  # one slot (batch row) per live sequence, fixed for its lifetime
    OLDEST = "oldest"  # the oldest ready requests among a replica's candidate sequences


class SequencePolicy(BaseModel):
    """How requests of a stateful model are gathered into batches.

    >>> SequencePolicy(strategy="oldest", max_batch_size=4,
    ...                max_candidate_sequences=16).sequences_per_replica
    16
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["sequence"] = "sequence"
    """Which scheduler: dynamic (stateless), sequence (stateful) or iterative (generative)."""
    strategy: SequenceStrategy = SequenceStrategy.DIRECT
    """`direct`: a slot per live sequence; `oldest`: the oldest ready requests of the
    candidate sequences."""
    max_batch_size: int = Field(default=8, ge=1)
    """direct: slots per replica (live sequences a replica holds, rows of a batch);
    oldest: most requests in one batch."""
    max_candidate_sequences: int | None = Field(default=None, ge=1)
    """oldest: live sequences a replica holds; None means max_batch_size."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Ready rows worth waiting for: a batch is sent once the largest is reached."""
    max_queue_delay_s: float = Field(default=0.0, ge=0)
    """Longest the oldest ready request waits for more rows to be ready; 0 never waits."""
    max_sequence_idle_s: float = Field(default=1.0, gt=0)
    """A live sequence with nothing queued or running for this long is ended: its slot
    and its state on the replica are freed."""
    max_pending_sequences: int | None = Field(default=None, ge=0)
    """Starts that may wait for a free slot; one more is rejected with QueueFull.
    None: unbounded; 0: a start is rejected when no slot is free."""

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _sorted_positive(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        return sorted_sizes(sizes)

    @model_validator(mode="after")
    def _consistent(self) -> SequencePolicy:
        check_preferred_fit(self.preferred_batch_sizes, self.max_batch_size)
        candidates = self.max_candidate_sequences
        if candidates is None:
            return self
        if self.strategy is SequenceStrategy.DIRECT:
            raise ValueError(
                f"max_candidate_sequences={candidates} only applies to strategy='oldest'; "
                "with 'direct' the slots per replica are max_batch_size: remove it or "
                "set strategy='oldest'"
            )
        if candidates < self.max_batch_size:
            raise ValueError(
                f"max_candidate_sequences={candidates} is below max_batch_size="
                f"{self.max_batch_size}: a batch takes one request per sequence, so raise "
                f"it to >= {self.max_batch_size} or lower max_batch_size"
            )
        return self

    @property
    def sequences_per_replica(self) -> int:
        """Live sequences (and their states) one replica holds."""
        if self.strategy is SequenceStrategy.DIRECT:
            return self.max_batch_size
        return self.max_candidate_sequences or self.max_batch_size

    @property
    def largest_preferred(self) -> int | None:
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else None
