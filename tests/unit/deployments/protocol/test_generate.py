"""The generate extension's codec: request bodies, responses and server-sent events."""

from __future__ import annotations

import json

import pytest

from batching.errors import InvalidRequest
from deployments.protocol.generate import generate_response, parse_generate_body, sse_event


def test_parameters_may_be_nested_or_top_level():
    body = b'{"id": "r1", "text_input": "hi", "parameters": {"stop": ["."]}, "max_tokens": 4}'
    assert parse_generate_body(body) == ("r1", "hi", {"stop": ["."], "max_tokens": 4})


@pytest.mark.parametrize("body, words", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"parameters": {}}', "text_input"),
    (b'{"text_input": "a", "parameters": [1]}', "'parameters' must be a JSON object"),
    (b'{"text_input": "a", "max_tokens": 1, "parameters": {"max_tokens": 2}}', "given both"),
    (b'{"text_input": "a", "id": 5}', "'id' must be a string"),
    (b'\xff\xfe', "not valid JSON"),
])
def test_bad_bodies_say_what_is_wrong(body, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_generate_body(body)


def test_response_carries_the_model_and_the_id_when_given():
    event = {"text_output": "abc", "final": True, "finish_reason": "length"}
    assert generate_response("m", "1", None, event) == {"model_name": "m", "model_version": "1",
                                                        **event}
    assert generate_response("m", "1", "x", event)["id"] == "x"


def test_an_sse_event_is_one_data_line_and_a_blank_line():
    raw = sse_event({"text_output": "a\nb"})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2
    assert json.loads(raw[6:]) == {"text_output": "a\nb"}
