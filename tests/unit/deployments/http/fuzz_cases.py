"""Malformed requests from a seed: OIP infer and generate bodies, OpenAI completions and
chat completions, headers, paths, methods.

Every case is wrong by construction (each corruption alone makes the request
invalid, so any mix of them does too), so the only right answer is a 4xx with
`{"error": <str>}`. The same cases drive the app in-process
(`tests/unit/deployments/http/test_fuzz.py`) and a real server
(`tests/e2e/test_fuzz_http.py`); `check` is the one verdict for both.

    for case in cases(seed=11, n=300, infer_model="square", generate_model="tinylm"):
        status, headers, body = send(case)
        check(case, status, headers, body)
"""

from __future__ import annotations

import gzip
import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HOLE = "@HOLE@"
DEEP = "[" * 10_000 + "]" * 10_000
DEEP_1000 = "[" * 1000 + "]" * 1000
DIGITS = "7" * 5000
INFER_HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Case:
    kind: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def __repr__(self) -> str:  # short, for a failing assertion
        return (f"Case({self.kind}, {self.method} {self.path[:80]!r}, "
                f"{len(self.headers)} headers, body {self.body[:120]!r}...)")


def _raw(doc: Any, raw: str | None = None) -> bytes:
    """`doc` as JSON, with the string HOLE (if any) replaced by raw JSON text."""
    text = json.dumps(doc)
    if raw is not None:
        text = text.replace(json.dumps(HOLE), raw, 1)
    return text.encode()


# --- infer bodies: one valid request, then corruptions that each make it invalid ----------

BAD_FIELD: dict[str, list[Any]] = {
    "datatype": ["", "FP", [], {}, 1, None, True, "BF16", "fp32", "INT32", "BYTES",
                 ("raw", DEEP), ("raw", DEEP_1000)],
    "shape": ["3", [], [[1]], [-1], [1.5], [True], None, {}, [1, 1], [10**12], [0],
              [2**64 - 1], ("raw", "[" + DIGITS + "]"), ("raw", DEEP), ("raw", DEEP_1000)],
    "data": ["x", None, {}, [[1], [2, 3]], ["a"], [True], [1.0, True], [None], [[[[]]]],
             ("raw", "[NaN]"), ("raw", "[Infinity]"), ("raw", "[-Infinity]"),
             ("raw", "[1e999]"), ("raw", "[1e39]"), ("raw", "[" + DIGITS + "]"),
             ("raw", DEEP), ("raw", "[" * 40 + "1" + "]" * 40)],
    "name": [None, 1, "", "INPUT9", [], "INPUT0\u0000", ("raw", DEEP_1000)],
    "parameters": ["x", [], 5, {"shared_memory_region": "r"}, {"binary_data_size": -1},
                   {"binary_data_size": 4}, ("raw", DEEP_1000)],
}
BAD_TOP: dict[str, list[Any]] = {
    "inputs": [None, [], {}, "x", [1], [[]], ("raw", DEEP)],
    "parameters": [[], "x", {"priority": -1}, {"priority": "high"}, {"priority": 2**70},
                   {"timeout": 1.5}, {"timeout": True}, {"triton_x": 1},
                   {"binary_data_output": 1}, {"sequence_start": "yes"}, {"sequence_id": -3},
                   {"sequence_id": 1.5}, ("raw", '{"priority": ' + DIGITS + "}"),
                   ("raw", '{"timeout": ' + DEEP + "}")],
    "outputs": ["y", {}, [{"name": "nope"}], [1], [{"name": "OUTPUT0",
                                                    "parameters": {"binary_data": "yes"}}],
                [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}],
                [{"name": "OUTPUT0", "parameters": {"classification": 2}}]],
    "id": [1, [], {}, 2.5, ("raw", DEEP_1000)],
}


def _valid_infer(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 4)
    return {"id": f"f{rng.randint(0, 999)}", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [n],
         "data": [round(rng.uniform(-9, 9), 3) for _ in range(n)]}]}


def _set(target: dict, key: str, value: Any) -> str | None:
    """Put `value` at `key`; a ("raw", text) value goes in as raw JSON text."""
    if isinstance(value, tuple):
        target[key] = HOLE
        return value[1]
    target[key] = value
    return None


def infer_json(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    doc = _valid_infer(rng)
    if rng.random() < 0.5:
        key = rng.choice(sorted(BAD_FIELD))
        raw = _set(doc["inputs"][0], key, rng.choice(BAD_FIELD[key]))
        return f"input.{key}", _raw(doc, raw), {}
    key = rng.choice(sorted(BAD_TOP))
    raw = _set(doc, key, rng.choice(BAD_TOP[key]))
    return key, _raw(doc, raw), {}


def infer_bytes(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    valid = _raw(_valid_infer(rng))
    choices: list[tuple[str, bytes]] = [
        ("truncated", valid[: rng.randrange(0, len(valid) - 1)]),
        ("empty", b""), ("not-an-object", b"[1, 2]"), ("string", b'"inputs"'),
        ("null", b"null"), ("number", b"5"), ("utf8", b'{"inputs": "\xff\xfe"}'),
        ("lone-surrogate", b'{"inputs": "\\ud800"}'), ("nul", b"\x00" * 16),
        ("bom", b"\xef\xbb\xbf" + valid), ("trailing", valid + b" x"),
        ("duplicate-inputs", valid[:-1] + b', "inputs": 5}'),
        ("random", bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))),
    ]
    kind, body = rng.choice(choices)
    if kind == "random" and body.strip().startswith((b"{", b"[")):
        body = b"\xff" + body  # cannot be valid JSON
    return kind, body, {}


def infer_binary(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    n = rng.randint(1, 4)
    head = _raw({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n],
                             "parameters": {"binary_data_size": 4 * n}}]})
    tensor = struct.pack(f"<{n}f", *range(n))
    length = str(len(head))
    choices = [
        ("length-superscript", head + tensor, "²"), ("length-arabic", head + tensor, "١٢"),
        ("length-negative", head + tensor, "-1"), ("length-zero", head + tensor, "0"),
        ("length-text", head + tensor, "abc"), ("length-empty", head + tensor, ""),
        ("length-past-body", head + tensor, str(len(head) + len(tensor) + 9)),
        ("length-short", head + tensor, str(len(head) - 3)),
        ("size-short", head + tensor[:-1], length), ("size-long", head + tensor + b"\x00", length),
        ("no-length", head + tensor, None),
    ]
    kind, body, value = rng.choice(choices)
    return kind, body, {} if value is None else {INFER_HEADER_LENGTH: value}


def infer_encoded(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    valid = _raw(_valid_infer(rng))
    choices = [("br", valid, "br"), ("gzip-junk", b"not gzip at all", "gzip"),
               ("gzip-truncated", gzip.compress(valid)[:-9], "gzip"),
               ("deflate-junk", b"\x00\x01\x02", "deflate"), ("x-unknown", valid, "zstd")]
    kind, body, encoding = rng.choice(choices)
    return kind, body, {"Content-Encoding": encoding}


# --- generate bodies ----------------------------------------------------------------------

BAD_GENERATE: list[Any] = [
    {"parameters": {"max_tokens": 3}}, {"text_input": 5}, {"text_input": None},
    {"text_input": ["a"]}, {"text_input": {}}, {"text_input": ""},
    {"text_input": "a", "parameters": "x"}, {"text_input": "a", "parameters": []},
    {"text_input": "a", "parameters": {"max_tokens": "5"}},
    {"text_input": "a", "parameters": {"max_tokens": 0}},
    {"text_input": "a", "parameters": {"max_tokens": -1}},
    {"text_input": "a", "parameters": {"max_tokens": 1.5}},
    {"text_input": "a", "parameters": {"max_tokens": True}},
    {"text_input": "a", "parameters": {"stop": [["x"]]}},
    {"text_input": "a", "parameters": {"stop": ""}},
    {"text_input": "a", "parameters": {"stop": ["."] * 17}},  # looked for at every step
    {"text_input": "a", "parameters": {"stop": "x" * 257}},
    {"text_input": "a", "parameters": {"temperature": 2.5}},
    {"text_input": "a", "parameters": {"top_p": 0}},
    {"text_input": "a", "parameters": {"seed": -1}},
    {"text_input": "a", "parameters": {"priority": -2}},
    {"text_input": "a", "parameters": {"priority": True}},
    {"text_input": "a", "parameters": {"timeout": True}},
    {"text_input": "a", "parameters": {"timeout": "soon"}},
    {"text_input": "a", "max_tokens": 2, "parameters": {"max_tokens": 3}},
    {"text_input": "a", "id": 7},
    ("raw", '{"text_input": ' + DEEP + "}"),
    ("raw", '{"text_input": "a", "max_tokens": ' + DIGITS + "}"),
    ("raw", '{"text_input": "a", "parameters": {"max_tokens": ' + DEEP_1000 + "}}"),
    ("raw", '{"text_input": "a", "parameters": {"stop": ' + DEEP + "}}"),
    ("raw", '{"text_input": "a", "max_tokens": NaN}'),
    ("raw", '{"text_input": "a", "max_tokens": 1e999}'),
    ("raw", '{"text_input": "a"'), ("raw", "[]"), ("raw", ""), ("raw", '"text"'),
]


def generate(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    doc = rng.choice(BAD_GENERATE)
    body = doc[1].encode() if isinstance(doc, tuple) else _raw(doc)
    return "generate", body, {}


# --- OpenAI completions and chat completions ------------------------------------------------

# Each a field set to something the API refuses ("@GEN@": the generative model's name,
# "@INFER@": a model that does not generate text; DROP: the field left out).
DROP = object()
BAD_OPENAI_COMMON: dict[str, list[Any]] = {
    "model": [DROP, None, 5, "", ["@GEN@"], "no-such-model", "@INFER@", ("raw", DEEP_1000)],
    "max_tokens": [0, -1, "5", 1.5, True, 2**70, ("raw", DIGITS), ("raw", "1e999")],
    "temperature": [-0.5, 2.5, "hot", True, [], {}, ("raw", "NaN"), ("raw", "1e999")],
    "top_p": [0, 1.5, "x", True, -1],
    "n": [2, 5, "1", True], "presence_penalty": [0.5, "x"], "frequency_penalty": [-1],
    "logit_bias": [{"5": 1}], "logprobs": [True, 2, 0],
    "stream": ["yes", 2, [], {}, 1, 0], "stream_options": [{"include_usage": True}],
    "stop": ["x" * 257, ["a", "b", "c", "d", "e"], [1], "", [""], {}, 5, [["x"]], ("raw", DEEP)],
    "seed": [-1, "x", 1.5, 2**63, True],
    "priority": [-1, "hi", 2**70], "timeout": [-5, "soon", 1.5],
    "frobnicate": [1, None],
}
BAD_OPENAI_COMPLETIONS: dict[str, list[Any]] = {
    "prompt": [DROP, None, 5, [], ["a", "b"], {"a": 1}, [1], True, ("raw", DEEP)],
    "echo": [True, 0], "best_of": [2], "suffix": ["x"],
    "messages": [[{"role": "user", "content": "a"}]],
}
BAD_OPENAI_CHAT: dict[str, list[Any]] = {
    "messages": [DROP, None, [], "hi", [{"role": "robot", "content": "a"}],
                 [{"content": "a"}], [{"role": "user", "content": 5}], ["a"], [None],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}],
                 ("raw", DEEP)],
    "tools": [[{"type": "function"}]], "tool_choice": ["auto"], "top_logprobs": [3],
    "response_format": [{"type": "json_object"}, "json"], "max_completion_tokens": [0, "9"],
    "prompt": ["x"],
}
BAD_OPENAI_RAW = ['{"model": "@GEN@"', "[]", "", '"x"', "null", '{"model": "@GEN@",}',
                  '{"model": "@GEN@", "prompt": "a", "prompt": 5}']


def _openai_path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def openai_case(chat: bool, key: str, value: Any, t: Target) -> Case:
    """A valid OpenAI request for `t`'s generative model with `key` set to `value`."""
    doc: dict[str, Any] = {"model": t.generate_model, "max_tokens": 3}
    if chat:
        doc["messages"] = [{"role": "user", "content": "a"}]
    else:
        doc["prompt"] = "a"
    raw = None
    if value is DROP:
        del doc[key]
    else:
        if isinstance(value, str):
            value = value.replace("@GEN@", t.generate_model).replace("@INFER@", t.infer_model)
        elif value == ["@GEN@"]:
            value = [t.generate_model]
        raw = _set(doc, key, value)
    return Case(f"openai.{key}", "POST", _openai_path(chat), (), _raw(doc, raw))


def openai_raw_case(chat: bool, raw: str, t: Target) -> Case:
    return Case("openai-raw", "POST", _openai_path(chat), (),
                raw.replace("@GEN@", t.generate_model).encode())


def openai_tables(chat: bool) -> dict[str, list[Any]]:
    return {**BAD_OPENAI_COMMON, **(BAD_OPENAI_CHAT if chat else BAD_OPENAI_COMPLETIONS)}


def openai(rng: random.Random, t: Target) -> Case:
    """One OpenAI request that the API refuses."""
    chat = rng.random() < 0.5
    if rng.random() < 0.08:
        return openai_raw_case(chat, rng.choice(BAD_OPENAI_RAW), t)
    table = openai_tables(chat)
    key = rng.choice(sorted(table))
    return openai_case(chat, key, rng.choice(table[key]), t)


def every_corruption(t: Target) -> list[Case]:
    """Each infer, generate and OpenAI body corruption once: the claim that each alone is
    refused (the seeded draw reaches a sample of them)."""
    out = []
    for table, where in ((BAD_FIELD, "input"), (BAD_TOP, "top")):
        for key, values in sorted(table.items()):
            for value in values:
                doc = _valid_infer(random.Random(0))
                raw = _set(doc["inputs"][0] if where == "input" else doc, key, value)
                out.append(Case(f"{where}.{key}", "POST", f"/v2/models/{t.infer_model}/infer",
                                (), _raw(doc, raw)))
    out += [Case("generate", "POST", f"/v2/models/{t.generate_model}/{suffix}", (),
                 doc[1].encode() if isinstance(doc, tuple) else _raw(doc))
            for doc in BAD_GENERATE for suffix in ("generate", "generate_stream")]
    for chat in (False, True):
        out += [openai_case(chat, key, value, t)
                for key, values in sorted(openai_tables(chat).items()) for value in values]
        out += [openai_raw_case(chat, raw, t) for raw in BAD_OPENAI_RAW]
    return out


# --- headers, paths, methods ----------------------------------------------------------------

PATHS = [
    "/", "/v2/", "/v2/models", "/v2/models/", "/v2/models//infer", "/v2/models/%2e%2e/infer",
    "/v2/models/..%2f..%2fetc%2fpasswd/infer", "/v2/models/%2e%2e%2f%2e%2e/infer",
    "/v2/models/{m}/infer/", "/v2/models/{m}/versions//infer", "/v2/models/{m}/versions/9/infer",
    "/v2/models/nope/infer", "/v2/models/{m}/explain", "/v2/models/%00/infer",
    "/v2/models/%C3%A9/infer", "/v2/models/-x/infer", "/v1/models/{m}/infer",
    "/v2/models/{m}/infer%00", "/v2/models/" + "a" * 3000 + "/infer", "/V2/health/live",
    "/v2/health", "/v2/models/{m}/versions/1/2/infer", "/v2/models/{m}%2f..",
]
WRONG_METHODS = [("GET", "/v2/models/{m}/infer"), ("PUT", "/v2/models/{m}/infer"),
                 ("DELETE", "/v2/models/{m}/infer"), ("PATCH", "/v2/models/{m}/infer"),
                 ("OPTIONS", "/v2/models/{m}/infer"), ("POST", "/v2/models/{m}"),
                 ("POST", "/v2/health/ready"), ("PUT", "/v2"), ("DELETE", "/v2/models/{m}"),
                 ("GET", "/v2/models/{g}/generate"), ("GET", "/v2/models/{g}/generate_stream")]


@dataclass(frozen=True)
class Target:
    infer_model: str
    generate_model: str
    max_body_bytes: int
    max_header_count: int = 100
    max_header_bytes: int = 16 * 2**10


def _case(rng: random.Random, t: Target) -> Case:
    roll = rng.random()
    infer_path = f"/v2/models/{t.infer_model}/infer"
    if roll < 0.30:
        kind, body, headers = infer_json(rng)
    elif roll < 0.42:
        kind, body, headers = infer_bytes(rng)
    elif roll < 0.52:
        kind, body, headers = infer_binary(rng)
    elif roll < 0.57:
        kind, body, headers = infer_encoded(rng)
    elif roll < 0.64:
        return openai(rng, t)
    elif roll < 0.72:
        kind, body, headers = generate(rng)
        suffix = rng.choice(["generate", "generate_stream"])
        return Case(kind, "POST", f"/v2/models/{t.generate_model}/{suffix}",
                    _headers(headers), body)
    elif roll < 0.82:
        path = rng.choice(PATHS).format(m=t.infer_model)
        method = rng.choice(["GET", "POST"])
        return Case("path", method, path, (), _raw(_valid_infer(rng)) if method == "POST" else b"")
    elif roll < 0.90:
        method, path = rng.choice(WRONG_METHODS)
        return Case("method", method, path.format(m=t.infer_model, g=t.generate_model), (), b"")
    else:
        return _limit_case(rng, t, infer_path)
    return Case(kind, "POST", infer_path, _headers(headers), body)


def _limit_case(rng: random.Random, t: Target, path: str) -> Case:
    which = rng.choice(["count", "bytes", "body", "items"])
    valid = _raw(_valid_infer(rng))
    if which == "count":
        extra = tuple((f"x-fuzz-{i}", "1") for i in range(t.max_header_count + 5))
        return Case("header-count", "POST", path, extra, valid)
    if which == "bytes":
        return Case("header-bytes", "POST", path, (("x-fuzz", "v" * t.max_header_bytes),), valid)
    if which == "body":
        n = t.max_body_bytes // 4 + 100
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n],
                           "data": [0.5] * n}]}
        return Case("body-too-large", "POST", path, (), _raw(doc))
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [10**15],
                       "parameters": {"binary_data_size": 8}}]}
    head = _raw(doc)
    return Case("elements", "POST", path, ((INFER_HEADER_LENGTH, str(len(head))),),
                head + b"\x00" * 8)


def _headers(headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(headers.items())


def cases(seed: int, n: int, target: Target) -> list[Case]:
    """`n` malformed requests for a server whose limits and models `target` names."""
    rng = random.Random(seed)
    return [_case(rng, target) for _ in range(n)]


INTERNALS = ("Traceback", 'File "', ".py", "/work/", "site-packages", "0x7f")


def check(case: Case, status: int, headers: dict[str, str], body: bytes,
          allowed: Callable[[int], bool] = lambda s: 400 <= s < 500) -> str:
    """The verdict: a 4xx whose body is `{"error": <str>}` with nothing internal in it
    (under /v1, the OpenAI API's: `{"error": {"message": <str>, "type", "param", "code"}}`)."""
    assert allowed(status), (case, status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), (case, headers)
    doc = json.loads(body)
    assert isinstance(doc, dict) and set(doc) == {"error"}, (case, doc)
    message = doc["error"]
    if case.path.startswith("/v1/"):
        assert set(message) == {"message", "type", "param", "code"}, (case, doc)
        message = message["message"]
    assert isinstance(message, str) and 0 < len(message) <= 2_000, (case, message)
    for word in INTERNALS:
        assert word not in message, (case, message)
    return message
