"""`ChatTemplateConfig`: a template that could not be used is refused at load, saying why."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.chat import MAX_TEMPLATE_STOPS, ChatTemplateConfig


def test_the_default_renders_and_stops_at_the_next_user_turn():
    t = ChatTemplateConfig()
    assert t.message.format(role="user", content="hi") == "user: hi\n"
    assert t.stop == ("\nuser:",)


@pytest.mark.parametrize("fields, words", [
    ({"message": "{role}: {text}"}, "only {role} and {content}"),
    ({"message": "{role}"}, "must contain {content}"),
    ({"stop": ["ok", ""]}, "each stop string must be non-empty"),
    # each step of every sequence looks for each stop string: a request's 4 and the
    # template's go to the engine together, which takes 16 of at most 256 characters
    ({"stop": ["s"] * (MAX_TEMPLATE_STOPS + 1)}, "at most 12 stop strings"),
    ({"stop": ["x" * 257]}, "each of at most 256 characters"),
])
def test_a_template_that_cannot_be_used_is_refused_saying_why(fields, words):
    with pytest.raises(ValidationError, match=words):
        ChatTemplateConfig(**fields)


def test_the_most_stops_allowed_are_taken():
    assert len(ChatTemplateConfig(stop=["x" * 256] * MAX_TEMPLATE_STOPS).stop) == 12
