"""Hostile generate request bodies, OpenAI's and OIP generate's, generated from a fixed
seed: each is either turned into a generate request the batcher accepts, or refused with
a 4xx naming what was wrong (in OpenAI's error shape on its routes). Nothing else may come
out of the parsing (a TypeError, a KeyError, an OverflowError, a 5xx), whatever the values,
types, nesting or bytes."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from batching.errors import InvalidRequest
from deployments.http.oip.errors import error_parts
from deployments.protocol.generate import parse_generate_body
from deployments.protocol.openai import (
    COMPLETION_FIELDS,
    ChatTemplate,
    OpenAIRefusal,
    openai_request,
    parse_openai_body,
)
from deployments.wire.generation import generate_request

CASES = 3000
VALID = {
    False: {"model": "tinylm", "prompt": "Once upon", "max_tokens": 8, "temperature": 0.5,
            "top_p": 0.9, "seed": 3, "stop": ["\n"], "stream": True,
            "stream_options": {"include_usage": True}, "priority": 1, "timeout": 10**6},
    True: {"model": "tinylm", "messages": [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": [
                                               {"type": "text", "text": "yes"}]}],
           "max_completion_tokens": 4, "temperature": 0, "n": 1, "logprobs": False,
           "response_format": {"type": "text"}},
}
CHAT_FIELDS = sorted({"messages", "max_completion_tokens", "top_logprobs", "response_format",
                      "tools", "tool_choice", "parallel_tool_calls"} | COMPLETION_FIELDS)


def hostile(rng: random.Random, depth: int = 0):
    """A JSON value chosen to break a parser's assumptions: edge numbers, wrong types,
    braces and control characters in strings, deep or empty containers."""
    pick = rng.randrange(14 if depth < 3 else 9)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30)])
    if pick == 3:
        return rng.choice([0.0, -0.0, 1e-300, 0.5, 1.0, 2.0, 2.0000001, -1.5, 1e308])
    if pick == 4:
        return rng.choice(["", " ", "{role}", "{content}{0}", "\x00", "\n\nuser:", "é" * 3,
                           "x" * 5000, "\ud7ff", "null", "[DONE]"])
    if pick == 5:
        return rng.randrange(-3, 300)
    if pick == 6:
        return rng.random() * rng.choice([1, 3, 1e6])
    if pick == 7:
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(8)))
    if pick == 8:
        return rng.choice([[], {}, [""], [None], {"": None}])
    if pick in (9, 10):
        return [hostile(rng, depth + 1) for _ in range(rng.randrange(5))]
    if pick == 11:
        return {rng.choice(["role", "content", "type", "text", "include_usage", "x"]):
                hostile(rng, depth + 1) for _ in range(rng.randrange(4))}
    if pick == 12:  # a message, right or nearly
        return {"role": rng.choice(["user", "system", "assistant", "developer", "tool", 1]),
                "content": hostile(rng, depth + 1)}
    return [{"type": rng.choice(["text", "image_url"]), "text": hostile(rng, depth + 1)}]


OIP_VALID = {"id": "r1", "text_input": "Once upon",
             "parameters": {"max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "seed": 3,
                            "stop": ["\n"], "priority": 1, "timeout": 10**6}}
OIP_FIELDS = ["id", "text_input", "parameters", "max_tokens", "temperature", "top_p", "seed",
              "stop", "priority", "timeout", "timeout_s"]


def mutated(rng: random.Random, valid: dict, fields: list[str]) -> bytes:
    doc = json.loads(json.dumps(valid))
    for _ in range(rng.randrange(1, 4)):
        how = rng.randrange(5)
        if how == 0 and doc:
            del doc[rng.choice(sorted(doc))]
        elif how == 1:
            doc[rng.choice(fields)] = hostile(rng)
        elif how == 4 and isinstance(doc.get("parameters"), dict):
            doc["parameters"][rng.choice(fields)] = hostile(rng)
        elif how == 2:
            doc[rng.choice(sorted(doc) or ["model"])] = hostile(rng)
        else:
            doc["unknown_" + str(rng.randrange(3))] = hostile(rng)
    body = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
    cut = rng.randrange(12)
    if cut == 0:  # torn off mid-document
        return body[:rng.randrange(len(body) + 1)]
    if cut == 1:  # one byte changed
        i = rng.randrange(len(body))
        return body[:i] + bytes([rng.randrange(256)]) + body[i + 1:]
    return body


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_hostile_bodies_become_a_checked_generate_request_or_a_4xx_in_openai_shape(chat):
    rng = random.Random(20261201 + chat)
    template = ChatTemplate()
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(CASES):
        body = mutated(rng, VALID[chat], CHAT_FIELDS if chat else sorted(COMPLETION_FIELDS))
        try:
            doc, model = parse_openai_body(body, chat)
            req = openai_request(doc, model, chat, template)
            generate_request(case, req.prompt, req.params)  # what the batcher checks next
        except OpenAIRefusal as e:
            status, raw, _ = error_parts(e, openai=True)
            error = orjson.loads(raw)["error"]
            assert 400 <= status < 500 and error["message"], (body, status)
            assert error["param"] is None or isinstance(error["param"], str), body
            outcomes["refused"] += 1
            continue
        except InvalidRequest as e:  # the generate request's own checks: a 400 too
            status, raw, _ = error_parts(e, openai=True)
            assert status == 400 and orjson.loads(raw)["error"]["message"], body
            outcomes["refused"] += 1
            continue
        assert isinstance(req.prompt, str) and req.model == model, body
        assert set(req.params) <= {"temperature", "top_p", "max_tokens", "stop", "seed",
                                   "priority", "timeout"}, body
        outcomes["accepted"] += 1
    # the mutations reach both sides of the checks, not only the JSON parser's refusals
    assert outcomes["accepted"] > CASES // 20 and outcomes["refused"] > CASES // 4, outcomes


def test_hostile_oip_generate_bodies_become_a_checked_generate_request_or_a_400():
    rng = random.Random(20261202)
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(CASES):
        body = mutated(rng, OIP_VALID, OIP_FIELDS)
        try:
            request_id, text, params = parse_generate_body(body)
            generate_request(case, text, params)
        except InvalidRequest as e:
            status, raw, _ = error_parts(e)
            assert status == 400 and orjson.loads(raw)["error"], body
            outcomes["refused"] += 1
            continue
        assert request_id is None or isinstance(request_id, str), body
        outcomes["accepted"] += 1
    assert outcomes["accepted"] > CASES // 20 and outcomes["refused"] > CASES // 4, outcomes
