"""OpenAI request bodies to generate parameters, and the answers' shapes."""

from __future__ import annotations

import json

import pytest

from deployments.protocol.openai import (
    ChatTemplate,
    ModelNotFound,
    OpenAIRefusal,
    chunk,
    error_doc,
    openai_request,
    parse_openai_body,
    response,
    text_chunker,
)


def req(doc: dict, chat: bool = False, template: ChatTemplate | None = None):
    body, model = parse_openai_body(json.dumps(doc).encode(), chat)
    return openai_request(body, model, chat, template)


def refusal(doc: dict, chat: bool = False) -> OpenAIRefusal:
    with pytest.raises(OpenAIRefusal) as e:
        req(doc, chat)
    return e.value


def test_a_completion_carries_openai_defaults_written_out():
    r = req({"model": "tinylm", "prompt": "Once"})
    assert (r.chat, r.model, r.prompt, r.stream) == (False, "tinylm", "Once", False)
    assert r.params == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16}
    r = req({"model": "m", "prompt": ["one"], "max_tokens": 5, "temperature": 0,
             "top_p": 0.5, "seed": 7, "stop": "\n", "priority": 2, "timeout": 5_000_000})
    assert r.params == {"temperature": 0.0, "top_p": 0.5, "max_tokens": 5, "stop": ["\n"],
                        "seed": 7, "priority": 2, "timeout": 5_000_000}


def test_a_chat_renders_its_messages_through_the_template_and_adds_its_stops():
    r = req({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                     {"type": "text", "text": " there"}]}],
        "stop": ["."], "max_completion_tokens": 9}, chat=True)
    assert r.prompt == "system: Be brief.\nuser: Hi there\nassistant:"
    assert r.params["stop"] == [".", "\nuser:"] and r.params["max_tokens"] == 9
    assert "max_tokens" not in req({"model": "m", "messages": [
        {"role": "user", "content": "x"}]}, chat=True).params  # the model's own limit
    own = ChatTemplate("<{role}>{content}</{role}>", "<assistant>", ("</assistant>",))
    r = req({"model": "m", "messages": [{"role": "user", "content": "q"}]}, True, own)
    assert r.prompt == "<user>q</user><assistant>" and r.params["stop"] == ["</assistant>"]


@pytest.mark.parametrize("doc, param, code", [
    ({"model": "m", "prompt": "x", "n": 2}, "n", "unsupported_value"),
    ({"model": "m", "prompt": "x", "best_of": 3}, "best_of", "unsupported_value"),
    ({"model": "m", "prompt": "x", "logprobs": 2}, "logprobs", "unsupported_value"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo", "unsupported_value"),
    # of the neutral value's type too: Python's True == 1 and 0 == False let these by
    ({"model": "m", "prompt": "x", "n": True}, "n", "unsupported_value"),
    ({"model": "m", "prompt": "x", "n": 1.0}, "n", "unsupported_value"),
    ({"model": "m", "prompt": "x", "echo": 0}, "echo", "unsupported_value"),
    ({"model": "m", "prompt": "x", "logprobs": 0}, "logprobs", "unsupported_value"),
    ({"model": "m", "prompt": "x", "stream": 1}, "stream", "invalid_value"),
    ({"model": "m", "prompt": "x", "stream": 0}, "stream", "invalid_value"),
    ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty",
     "unsupported_value"),
    ({"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens", "invalid_value"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens", "invalid_value"),
    ({"model": "m", "prompt": "x", "temperature": 2.5}, "temperature", "invalid_value"),
    ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature", "invalid_value"),
    ({"model": "m", "prompt": "x", "top_p": 0}, "top_p", "invalid_value"),
    ({"model": "m", "prompt": "x", "seed": -3}, "seed", "invalid_value"),
    ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"model": "m", "prompt": "x", "stop": [""]}, "stop", "invalid_value"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream", "invalid_value"),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options", "invalid_value"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt", "unsupported_value"),
    ({"model": "m", "prompt": 5}, "prompt", "invalid_value"),
    ({"model": "m"}, "prompt", "missing_required_parameter"),
    ({"prompt": "x"}, "model", "missing_required_parameter"),
    ({"model": "m", "prompt": "x", "frobnicate": 1}, "frobnicate", "unknown_parameter"),
])
def test_what_cannot_be_honoured_is_refused_naming_its_field(doc, param, code):
    e = refusal(doc)
    assert (e.param, e.code) == (param, code), str(e)
    assert e.http_status == 400


@pytest.mark.parametrize("fmt", [
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    "json", {}])
def test_a_response_format_other_than_text_is_refused_not_ignored(fmt):
    # a client asking for JSON would otherwise get free text, with a 200
    messages = [{"role": "user", "content": "x"}]
    e = refusal({"model": "m", "messages": messages, "response_format": fmt}, chat=True)
    assert (e.param, e.code) == ("response_format", "unsupported_value"), str(e)
    plain = req({"model": "m", "messages": messages, "response_format": {"type": "text"}},
                chat=True)
    assert plain.prompt == "user: x\nassistant:"


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ("hi", "messages"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}], "messages[1].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}],
     "messages[0].content"),
])
def test_bad_chat_messages_are_refused_naming_the_message(messages, param):
    assert refusal({"model": "m", "messages": messages}, chat=True).param == param


def test_a_body_that_is_not_a_json_object_is_refused():
    for body in (b"{", b"[1]", b"\"text\"", b"NaN"):
        with pytest.raises(OpenAIRefusal) as e:
            parse_openai_body(body, False)
        assert e.value.code == "invalid_json"


def test_answers_have_openai_shapes():
    final = {"text_output": "Hi!", "final": True, "finish_reason": "eos", "num_tokens": 4,
             "prompt_tokens": 3}
    r = req({"model": "m", "prompt": "x"})
    doc = response(r, final)
    assert doc["object"] == "text_completion" and doc["id"].startswith("cmpl-")
    assert doc["choices"] == [{"index": 0, "text": "Hi!", "logprobs": None,
                               "finish_reason": "stop"}]
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    c = req({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
             "stream_options": {"include_usage": True}}, chat=True)
    first = json.loads(chunk(c, None, None, role=True)[6:])
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = json.loads(chunk(c, None, "length")[6:])
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "length"}
    use = json.loads(chunk(c, None, None, {"prompt_tokens": 1})[6:])
    assert use["choices"] == [] and use["usage"] == {"prompt_tokens": 1}


def test_errors_have_openai_shape():
    e = OpenAIRefusal("n=2 is not supported", "n", "unsupported_value")
    assert error_doc(400, str(e), e) == {"error": {
        "message": "n=2 is not supported", "type": "invalid_request_error", "param": "n",
        "code": "unsupported_value"}}
    assert error_doc(404, "x", ModelNotFound("x"))["error"]["code"] == "model_not_found"
    assert error_doc(429, "slow down")["error"]["type"] == "rate_limit_error"
    assert error_doc(503, "draining")["error"]["type"] == "server_error"


def test_a_text_chunk_built_around_its_text_is_the_chunk_byte_for_byte():
    for doc, chat in (({"model": "m", "prompt": "x", "stream": True}, False),
                      ({"model": "m", "messages": [{"role": "user", "content": "x"}],
                        "stream": True, "stream_options": {"include_usage": True}}, True)):
        r = req(doc, chat)
        text = text_chunker(r)
        for piece in ("", "a", 'q"uote\\', "\n\x00\u2028é😀", "x" * 1000):
            assert text(piece) == chunk(r, piece, None)
