"""DynamicPolicy: validation at the edge, with messages that name the value and the fix."""

from __future__ import annotations

import pydantic
import pytest

from batching import DynamicPolicy, QueuePolicy, TimeoutAction


def error_of(**kw) -> str:
    with pytest.raises(pydantic.ValidationError) as info:
        DynamicPolicy(**kw)
    return str(info.value)


@pytest.mark.parametrize(("field", "value", "bound"), [
    ("max_batch_size", 0, "greater than or equal to 1"),
    ("max_queue_delay_s", -0.5, "greater than or equal to 0"),
    ("priority_levels", 0, "greater than or equal to 1"),
    ("default_priority_level", 0, "greater than or equal to 1"),
    ("max_batch_cost", 0, "greater than 0"),
    ("target_latency_s", 0, "greater than 0"),
])
def test_out_of_bounds_numbers_name_field_value_and_bound(field, value, bound):
    msg = error_of(**{field: value})
    assert field in msg and f"input_value={value}" in msg and bound in msg


def test_preferred_size_above_max_batch_size_names_both_and_the_fix():
    msg = error_of(max_batch_size=4, preferred_batch_sizes=(2, 8))
    assert "preferred_batch_sizes [8]" in msg and "max_batch_size=4" in msg
    assert "lower them or raise max_batch_size" in msg


def test_non_positive_preferred_size_is_named():
    msg = error_of(preferred_batch_sizes=(0, 4))
    assert "preferred_batch_sizes=[0, 4] has [0]" in msg and ">= 1" in msg


def test_default_priority_level_out_of_range_names_the_range():
    msg = error_of(priority_levels=2, default_priority_level=3)
    assert "default_priority_level=3" in msg and "priority_levels=2" in msg and "1..2" in msg


def test_queue_policy_for_a_missing_level_names_the_range():
    msg = error_of(priority_levels=2, priority_queue_policy={3: QueuePolicy()})
    assert "level 3" in msg and "1..2" in msg


def test_adaptive_without_target_latency_says_what_to_add():
    msg = error_of(adaptive_delay=True)
    assert "adaptive_delay=True needs target_latency_s" in msg and "target_latency_s=0.05" in msg


def test_max_batch_cost_below_one_item_without_cost_fn():
    msg = error_of(max_batch_cost=0.5)
    assert "max_batch_cost=0.5" in msg and "give a cost_fn" in msg
    assert DynamicPolicy(max_batch_cost=0.5, cost_fn=lambda x: 0.1).max_batch_cost == 0.5


def test_unknown_settings_are_refused():
    assert "max_batch_sise" in error_of(max_batch_sise=4)


@pytest.mark.parametrize(("field", "value"), [
    ("max_queue_size", 0), ("default_timeout_s", 0), ("timeout_action", "drop")])
def test_queue_policy_bounds(field, value):
    with pytest.raises(pydantic.ValidationError, match=field):
        QueuePolicy(**{field: value})


def test_preferred_sizes_are_sorted_and_deduplicated():
    p = DynamicPolicy(max_batch_size=8, preferred_batch_sizes=(8, 2, 4, 2))
    assert p.preferred_batch_sizes == (2, 4, 8)
    assert p.largest_preferred == 8
    assert DynamicPolicy().largest_preferred is None


def test_default_level_is_the_lowest_unless_named():
    assert DynamicPolicy(priority_levels=3).default_level == 3
    assert DynamicPolicy(priority_levels=3, default_priority_level=1).default_level == 1


def test_queue_policy_per_level_falls_back_to_the_default():
    slow, fast = QueuePolicy(default_timeout_s=9.0), QueuePolicy(default_timeout_s=0.1)
    p = DynamicPolicy(priority_levels=3, default_queue_policy=slow,
                      priority_queue_policy={1: fast})
    assert (p.queue_policy(1), p.queue_policy(2), p.queue_policy(3)) == (fast, slow, slow)


def test_reads_from_plain_data_as_a_config_file_gives_it():
    p = DynamicPolicy.model_validate({
        "max_batch_size": 16,
        "preferred_batch_sizes": [4, 8],
        "priority_levels": 2,
        "priority_queue_policy": {"1": {"default_timeout_s": 0.5, "timeout_action": "delay"}},
    })
    assert p.preferred_batch_sizes == (4, 8)
    assert p.queue_policy(1).timeout_action is TimeoutAction.DELAY
    assert p.queue_policy(2) == QueuePolicy()


def test_policy_is_frozen():
    p = DynamicPolicy()
    with pytest.raises(pydantic.ValidationError):
        p.max_batch_size = 4
