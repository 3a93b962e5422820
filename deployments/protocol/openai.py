"""The OpenAI API's completions and chat completions, as generate requests and events.

What it decides: an OpenAI request is one generation on the same continuous batcher as
`/v2/models/{m}/generate` (`prompt`, or the chat messages through the model's chat
template, becomes `text_input`; `max_tokens`, `temperature`, `top_p`, `stop`, `seed`
become its parameters, with OpenAI's defaults written out so that the same values given
to OIP generate give the same tokens). A parameter the batcher cannot honour is refused
with a 400 naming it (`n` > 1, `logprobs`, penalties, tools...), never ignored: a client
that asked for it would get something else than it asked for. Unknown fields are
refused as OpenAI does. The answers and stream chunks have OpenAI's shapes
(`text_completion`, `chat.completion`, `chat.completion.chunk`, `data: [DONE]`), and so
do errors: `{"error": {"message", "type", "param", "code"}}`.

Raybatch's own parameters ride along as extra body fields (`extra_body` in the `openai`
package): `priority` and `timeout` (microseconds), as for OIP generate.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from batching.errors import InvalidRequest
from cluster.chat import OPENAI_MAX_STOPS
from deployments.protocol.limits import shown
from deployments.protocol.request import load_json

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # ours -> OpenAI's
DONE = b"data: [DONE]\n\n"

_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
           "stop", "seed", "user", "priority", "timeout", "logprobs", "presence_penalty",
           "frequency_penalty", "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs",
                         "response_format", "tools", "tool_choice", "parallel_tool_calls"}
ROLES = ("system", "developer", "user", "assistant")

# Accepted only at the value that asks for nothing: what each would need is not built.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "logprobs": (None, False), "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    # JSON mode or a JSON schema would need constrained decoding: plain text only
    "response_format": (None, {"type": "text"}),
}


def _same(value: Any, allowed: tuple[Any, ...]) -> bool:
    """`value` is one of `allowed`, of its type too: `n: true` or `echo: 0` are not 1 or
    false (Python's `True == 1` would let them by)."""
    return any(type(value) is type(a) and value == a for a in allowed)


class OpenAIRefusal(InvalidRequest):
    """A request the OpenAI endpoints refuse; `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ModelNotFound(OpenAIRefusal):
    """No generative model of that name is served here."""

    http_status = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"the model {name!r} does not exist here: GET /v1/models lists the "
                         "generative models", "model", "model_not_found")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """How chat messages become one prompt: each message through `message` (with
    `{role}` and `{content}`), then `generation_prompt`; `stop` ends the answer where the
    model starts another turn."""

    message: str = "{role}: {content}\n"
    generation_prompt: str = "assistant:"
    stop: tuple[str, ...] = ("\nuser:",)

    def render(self, messages: list[tuple[str, str]]) -> str:
        return "".join(self.message.format(role=r, content=c) for r, c in messages) + \
            self.generation_prompt


@dataclass(slots=True)
class OpenAIRequest:
    """One checked OpenAI request: the model, the prompt and the generate parameters."""

    chat: bool
    model: str
    prompt: str
    params: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.id


def parse_openai_body(body: bytes, chat: bool) -> tuple[dict[str, Any], str]:
    """The body as a JSON object and its `model`; the rest is checked by `openai_request`."""
    try:
        doc = load_json(body)
    except InvalidRequest as e:
        raise OpenAIRefusal(str(e), None, "invalid_json") from None
    if not isinstance(doc, dict):
        raise OpenAIRefusal("the request body must be a JSON object", None, "invalid_json")
    unknown = sorted(set(doc) - (CHAT_FIELDS if chat else COMPLETION_FIELDS))
    if unknown:
        raise OpenAIRefusal(f"unrecognized request argument(s) supplied: {shown(unknown)}",
                            unknown[0], "unknown_parameter")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIRefusal("'model' is required: the name of a generative model "
                            "(GET /v1/models lists them)", "model", "missing_required_parameter")
    return doc, model


def openai_request(doc: dict[str, Any], model: str, chat: bool,
                   template: ChatTemplate | None = None) -> OpenAIRequest:
    """Check an OpenAI request body (parsed) and turn it into generate parameters."""
    for name, neutral in _NEUTRAL.items():
        if name in doc and not _same(doc[name], neutral):
            raise OpenAIRefusal(f"{name}={shown(doc[name])} is not supported by this server: "
                                f"leave it out (only {shown(neutral[1])} is accepted)",
                                name, "unsupported_value")
    stops = _stops(doc.get("stop"))
    if chat:
        template = template or ChatTemplate()
        prompt = template.render(_messages(doc.get("messages")))
        stops += tuple(s for s in template.stop if s not in stops)
        max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
        limit_name = "max_completion_tokens" if "max_completion_tokens" in doc else "max_tokens"
    else:
        prompt = _prompt(doc.get("prompt"))
        max_tokens = doc.get("max_tokens", 16)  # OpenAI's default for completions
        limit_name = "max_tokens"
    params: dict[str, Any] = {
        "temperature": _number(doc, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(doc, "top_p", 1.0, 0.0, 1.0, low_open=True),
    }
    if max_tokens is not None:
        if not _is_int(max_tokens) or max_tokens < 1:
            raise OpenAIRefusal(f"{limit_name} must be a positive integer, got "
                                f"{shown(max_tokens)}", limit_name)
        params["max_tokens"] = max_tokens
    if stops:
        params["stop"] = list(stops)
    for name in ("seed", "priority", "timeout"):
        value = doc.get(name)
        if value is not None:
            if not _is_int(value) or value < 0:
                raise OpenAIRefusal(f"{name} must be a non-negative integer, got "
                                    f"{shown(value)}", name)
            params[name] = value
    stream = doc.get("stream", False)
    if not _same(stream, (None, True, False)):
        raise OpenAIRefusal(f"stream must be true or false, got {shown(stream)}", "stream")
    options = doc.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)
                                or set(options) - {"include_usage"}):
        raise OpenAIRefusal("stream_options is an object {\"include_usage\": true|false}, "
                            "only with stream: true", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return OpenAIRequest(chat, model, prompt, params, bool(stream), include_usage)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(doc: dict[str, Any], name: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = doc.get(name)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value <= high \
        and (value > low if low_open else value >= low)
    if not ok:
        bound = f"{'above' if low_open else 'at least'} {low:g} and at most {high:g}"
        raise OpenAIRefusal(f"{name} must be a number {bound}, got {shown(value)}", name)
    return float(value)


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > OPENAI_MAX_STOPS:
        raise OpenAIRefusal(f"stop must be a non-empty string or a list of at most "
                            f"{OPENAI_MAX_STOPS} of them, got {shown(stop)}", "stop")
    return tuple(stops)


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1:
        raise OpenAIRefusal("one prompt per request: send each prompt as its own request "
                            "(they are batched together on the server)", "prompt",
                            "unsupported_value")
    raise OpenAIRefusal(f"prompt must be a string, got {shown(prompt)}", "prompt",
                        "missing_required_parameter" if prompt is None else "invalid_value")


def _messages(messages: Any) -> list[tuple[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise OpenAIRefusal("messages must be a non-empty list of {\"role\", \"content\"} "
                            "objects", "messages")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise OpenAIRefusal(f"messages[{i}] needs a role among {shown(list(ROLES))}, got "
                                f"{shown(role)}", f"messages[{i}].role")
        out.append((role, _content(m.get("content"), i)))
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise OpenAIRefusal(f"messages[{i}].content must be a string or a list of "
                        f"{{\"type\": \"text\", \"text\": ...}} parts, got {shown(content)}",
                        f"messages[{i}].content")


# -- answers ---------------------------------------------------------------------------------
def usage(final: dict[str, Any]) -> dict[str, int]:
    prompt, completion = final.get("prompt_tokens", 0), final.get("num_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def finish_reason(final: dict[str, Any]) -> str:
    return FINISH.get(final.get("finish_reason"), "stop")


def response(req: OpenAIRequest, final: dict[str, Any]) -> dict[str, Any]:
    """The whole answer of a non-streamed request, from `collect`'s final event."""
    text, reason = final["text_output"], finish_reason(final)
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {"id": req.response_id, "object": "chat.completion" if req.chat else
            "text_completion", "created": req.created, "model": req.model,
            "system_fingerprint": None, "choices": [choice], "usage": usage(final)}


def chunk(req: OpenAIRequest, text: str | None, reason: str | None,
          use: dict[str, int] | None = None, role: bool = False) -> bytes:
    """One SSE event of a streamed answer: a piece of text (`text`), the last piece
    (`reason`), the usage chunk (`use`, no choices), or a chat's first, with the `role`."""
    if use is not None:
        choices: list[dict[str, Any]] = []
    elif req.chat:
        delta: dict[str, Any] = {} if text is None else {"content": text}
        if role:
            delta = {"role": "assistant", "content": ""}
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]
    doc: dict[str, Any] = {"id": req.response_id, "object": "chat.completion.chunk"
                           if req.chat else "text_completion", "created": req.created,
                           "model": req.model, "system_fingerprint": None, "choices": choices}
    if req.include_usage:
        doc["usage"] = use
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def text_chunker(req: OpenAIRequest) -> Callable[[str], bytes]:
    """`chunk(req, text, None)` for any `text`, the bytes around the text built once per
    request: a stream sends one per token, and only the text changes."""
    whole = chunk(req, _MARK, None)
    prefix, suffix = whole.split(orjson.dumps(_MARK))
    return lambda text: b"%s%s%s" % (prefix, orjson.dumps(text), suffix)


_MARK = "\x00text\x00"  # no JSON string the rest of a chunk holds can contain it


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                        "owned_by": "raybatch"} for n in names]}


def error_doc(status: int, message: str, exc: BaseException | None = None) -> dict[str, Any]:
    """OpenAI's error shape for a status and message."""
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status)
    if kind is None:
        kind = "invalid_request_error" if status < 500 else "server_error"
    code = param = None
    if isinstance(exc, OpenAIRefusal):
        code, param = exc.code, exc.param
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
