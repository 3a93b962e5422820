"""IterativePolicy: validation at the edge, messages that name the value and the fix, and
the per-request checks (priority, max_tokens, prompt, timeout) that answer 400."""

from __future__ import annotations

import math

import pydantic
import pytest

from batching.errors import InvalidRequest
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest


def error_of(**kw) -> str:
    with pytest.raises(pydantic.ValidationError) as info:
        IterativePolicy(**kw)
    return str(info.value)


def test_defaults_and_discriminator():
    p = IterativePolicy()
    assert (p.kind, p.max_active, p.max_step_tokens, p.schedule) == (
        "iterative", 32, 2048, "continuous")
    assert (p.max_tokens_default, p.max_tokens_limit, p.default_level) == (64, 1024, 1)
    assert IterativePolicy.model_validate({"kind": "iterative", "schedule": "lockstep"}).schedule \
        == "lockstep"
    assert "kind" in error_of(kind="dynamic")


@pytest.mark.parametrize(("field", "value", "bound"), [
    ("max_active", 0, "greater than or equal to 1"),
    ("max_step_tokens", 0, "greater than or equal to 1"),
    ("max_tokens_default", 0, "greater than or equal to 1"),
    ("max_tokens_limit", 0, "greater than or equal to 1"),
    ("priority_levels", 0, "greater than or equal to 1"),
    ("max_queue_size", 0, "greater than or equal to 1"),
    ("default_timeout_s", 0, "greater than 0"),
])
def test_out_of_bounds_numbers_name_field_value_and_bound(field, value, bound):
    msg = error_of(**{field: value})
    assert field in msg and f"input_value={value}" in msg and bound in msg


def test_unknown_field_and_mutation_are_refused():
    assert "max_batch_size" in error_of(max_batch_size=4)
    with pytest.raises(pydantic.ValidationError):
        IterativePolicy().max_active = 3


def test_default_above_limit_names_both_and_the_fix():
    msg = error_of(max_tokens_default=100, max_tokens_limit=50)
    assert "max_tokens_default=100" in msg and "max_tokens_limit=50" in msg
    assert "lower the default or raise the limit" in msg


def test_step_budget_below_max_active_names_both_and_the_fix():
    msg = error_of(max_active=64, max_step_tokens=32)
    assert "max_step_tokens=32" in msg and "max_active=64" in msg
    assert "raise max_step_tokens or lower max_active" in msg


def test_default_priority_level_out_of_range_names_the_range():
    msg = error_of(priority_levels=2, default_priority_level=3)
    assert "default_priority_level=3" in msg and "priority_levels=2" in msg and "1..2" in msg


def test_request_checks_answer_400_with_the_fix():
    p = IterativePolicy(priority_levels=3, max_tokens_limit=100, max_step_tokens=64,
                        default_timeout_s=2.0)
    assert (p.level_of(None), p.level_of(0), p.level_of(1)) == (3, 3, 1)
    with pytest.raises(InvalidRequest, match=r"priority=4 is out of range.*1\.\.3"):
        p.level_of(4)
    assert (p.max_tokens_of(None), p.max_tokens_of(100)) == (64, 100)
    with pytest.raises(InvalidRequest, match=r"max_tokens=101 is out of range: ask for 1\.\.100"):
        p.max_tokens_of(101)
    with pytest.raises(InvalidRequest, match="max_tokens=0"):
        p.max_tokens_of(0)
    assert p.prompt_tokens_of(GenerateRequest("a", "x" * 64)) == 64
    assert p.prompt_tokens_of(GenerateRequest("a", "x" * 500, prompt_tokens=7)) == 7
    with pytest.raises(InvalidRequest, match=r"65 tokens.*shorten it or raise max_step_tokens"):
        p.prompt_tokens_of(GenerateRequest("a", "x" * 65))
    with pytest.raises(InvalidRequest, match="empty prompt"):
        p.prompt_tokens_of(GenerateRequest("a", ""))
    with pytest.raises(InvalidRequest, match="empty stop string"):
        p.prompt_tokens_of(GenerateRequest("a", "hi", stop=("",)))
    # every step looks for each stop string: their count and length are bounded
    assert p.prompt_tokens_of(GenerateRequest("a", "hi", stop=("x" * 256,) * 16)) == 2
    with pytest.raises(InvalidRequest, match=r"17 stop strings.*at most 16, each of at most 256"):
        p.prompt_tokens_of(GenerateRequest("a", "hi", stop=("\n",) * 17))
    with pytest.raises(InvalidRequest, match="the longest of 257 characters"):
        p.prompt_tokens_of(GenerateRequest("a", "hi", stop=("\n", "x" * 257)))
    assert (p.timeout_of(None), p.timeout_of(5.0), p.timeout_of(0.5)) == (2.0, 2.0, 0.5)
    assert IterativePolicy().timeout_of(None) == math.inf
    with pytest.raises(InvalidRequest, match="timeout_s=0 must be > 0"):
        p.timeout_of(0)
