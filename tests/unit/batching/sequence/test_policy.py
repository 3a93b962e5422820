"""SequencePolicy: defaults, the slots per replica, and messages that name value and fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batching.sequence.policy import SequencePolicy, SequenceStrategy


def test_defaults_are_direct_work_conserving_with_a_one_second_idle_timeout():
    p = SequencePolicy()
    assert (p.kind, p.strategy, p.max_queue_delay_s, p.max_sequence_idle_s) == (
        "sequence", SequenceStrategy.DIRECT, 0.0, 1.0)
    assert p.max_pending_sequences is None and p.sequences_per_replica == p.max_batch_size


def test_sequences_per_replica_is_the_slots_for_direct_and_the_candidates_for_oldest():
    assert SequencePolicy(max_batch_size=4).sequences_per_replica == 4
    assert SequencePolicy(strategy="oldest", max_batch_size=4).sequences_per_replica == 4
    oldest = SequencePolicy(strategy="oldest", max_batch_size=4, max_candidate_sequences=32)
    assert oldest.sequences_per_replica == 32


def test_preferred_sizes_are_sorted_and_deduplicated():
    p = SequencePolicy(max_batch_size=8, preferred_batch_sizes=(8, 2, 4, 2))
    assert p.preferred_batch_sizes == (2, 4, 8) and p.largest_preferred == 8


@pytest.mark.parametrize("kwargs, message", [
    ({"max_batch_size": 0}, "greater than or equal to 1"),
    ({"max_sequence_idle_s": 0}, "greater than 0"),
    ({"max_pending_sequences": -1}, "greater than or equal to 0"),
    ({"max_batch_size": 4, "preferred_batch_sizes": (2, 8)},
     r"preferred_batch_sizes \[8\] exceed max_batch_size=4: lower them or raise"),
    ({"preferred_batch_sizes": (0, 2)}, r"has \[0\]: every size must be >= 1"),
    ({"max_candidate_sequences": 16},
     "max_candidate_sequences=16 only applies to strategy='oldest'.*remove it or set"),
    ({"strategy": "oldest", "max_batch_size": 8, "max_candidate_sequences": 4},
     "max_candidate_sequences=4 is below max_batch_size=8.*raise it to >= 8"),
    ({"strategy": "newest"}, "'direct' or 'oldest'"),
    ({"max_batch_sizes": 4}, "Extra inputs are not permitted"),
])
def test_bad_settings_are_refused_with_the_value_and_the_fix(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        SequencePolicy(**kwargs)


def test_the_policy_is_frozen_and_round_trips_through_json():
    p = SequencePolicy(strategy="oldest", max_batch_size=4, max_candidate_sequences=8,
                       preferred_batch_sizes=(2, 4), max_queue_delay_s=0.002)
    with pytest.raises(ValidationError):
        p.max_batch_size = 5
    assert SequencePolicy.model_validate_json(p.model_dump_json()) == p
