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


class ChatTemplateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    message: str = "{role}: {content}\n"
    """Each message, in order: a format string with `{role}` (system, developer, user,
    assistant) and `{content}` (the message's text). Write `{{` and `}}` for braces."""
    generation_prompt: str = "assistant:"
    """Appended after the last message: where the model's answer begins."""
    stop: tuple[str, ...] = ("\nuser:",)
    """Stop strings added to every chat request's own: the answer ends where the model
    starts another turn (the stop string is not part of the answer)."""

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
        return v
