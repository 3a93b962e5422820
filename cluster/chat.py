"""`ChatTemplateConfig`: how `/v1/chat/completions` turns chat messages into a prompt.

A generative model reads one text; a chat is a list of (role, content) messages. The
template is a format string per message and the text that opens the answer, plus the
stop strings that end it where the model starts the next turn. It is plain `str.format`
(two fields), not Jinja: small enough to check here, at load, with a message that says
what is wrong. The default suits the demo's `tinylm`; a model whose training used
another turn format brings its own in its config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from batching.iterative.policy import MAX_STOP_CHARS, MAX_STOPS

OPENAI_MAX_STOPS = 4  # OpenAI's limit on a request's own `stop` sequences
# A chat request's own stop strings and the template's go to the engine together, which
# takes MAX_STOPS in all.
MAX_TEMPLATE_STOPS = MAX_STOPS - OPENAI_MAX_STOPS


class ChatTemplateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    message: str = "{role}: {content}\n"
    """Each message, in order: a format string with `{role}` (system, developer, user,
    assistant) and `{content}` (the message's text). Write `{{` and `}}` for braces."""
    generation_prompt: str = "assistant:"
    """Appended after the last message: where the model's answer begins."""
    stop: tuple[str, ...] = ("\nuser:",)
    """Stop strings added to every chat request's own: the answer ends where the model
    starts another turn (the stop string is not part of the answer). At most 12, each of
    at most 256 characters: a request adds up to 4 of its own."""

    @field_validator("message")
    @classmethod
    def _two_fields(cls, v: str) -> str:
        try:
            v.format(role="user", content="hi")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"chat_template.message={v!r} must be a format string with only "
                             f"{{role}} and {{content}} ({type(e).__name__}: {e}); write {{{{ "
                             "and }} for literal braces") from None
        if "{content}" not in v:
            raise ValueError(f"chat_template.message={v!r} must contain {{content}}")
        return v

    @field_validator("stop")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not all(v):
            raise ValueError("chat_template.stop: each stop string must be non-empty")
        if len(v) > MAX_TEMPLATE_STOPS or any(len(s) > MAX_STOP_CHARS for s in v):
            raise ValueError(f"chat_template.stop: at most {MAX_TEMPLATE_STOPS} stop strings "
                             f"(a request adds up to {OPENAI_MAX_STOPS} of its own), each of "
                             f"at most {MAX_STOP_CHARS} characters")
        return v
