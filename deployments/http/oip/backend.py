"""The seam between the HTTP front and what serves the models.

The front parses and answers; a `Backend` runs things: in a Serve ingress replica
it is `deployments.ingress.deployment.ServeBackend` (the models' `ModelRoute`s and batching
actors); in a unit test or an in-process benchmark, a fake with a model or two. The
front never imports Ray, so it can be driven, and measured, without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from deployments.protocol import InferRequest, ModelSpec
from deployments.protocol.openai import ChatTemplate


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A served model as the front sees it: its name, version and tensors; a generative
    one (`generate`, the OpenAI routes) also how its chats become a prompt."""

    name: str
    version: str
    spec: ModelSpec
    generative: bool = False
    chat_template: ChatTemplate | None = None


class Backend(Protocol):
    def models(self) -> Sequence[ModelEntry]:
        """Every served model."""
        ...

    def model(self, name: str, version: str | None = None) -> ModelEntry:
        """The model `name` (at `version`, when given); `UnknownModel` (404) if none."""
        ...

    async def ready(self, model: ModelEntry) -> bool:
        """Whether `model` can serve now."""
        ...

    async def stats(self, model: ModelEntry) -> dict[str, Any]:
        """`model`'s statistics as one `$model_stat` object of Triton's extension."""
        ...

    async def infer(self, model: ModelEntry, request: InferRequest,
                    received_s: float | None = None) -> dict[str, np.ndarray]:
        """The outputs of one parsed infer request, or the error that ended it.
        `received_s`: when the request arrived (`time.monotonic()`); its timeout counts
        from then."""
        ...

    # Optional: `OipApp.quick` answers infer requests without a coroutine through it.
    def submit_infer(self, model: ModelEntry, request: InferRequest,
                     received_s: float | None = None, requests: int = 1
                     ) -> tuple[asyncio.Future, Callable[[Any], dict[str, np.ndarray]]]:
        """`infer` up to the wait: the future of the engine's value (cancelling it
        cancels the request) and what turns that value into the outputs. Raises what
        `infer` raises before it waits. `requests`: the clients' requests it stands for
        (a block of the native front's), as the engine's metrics count them."""
        ...

    # Optional: the native front withdraws the rows of a block's clients that hung up.
    def withdraw_infer(self, model: ModelEntry, future: asyncio.Future, rows: Any) -> bool:
        """Withdraw the rows `rows` (indices into its items) of a block `submit_infer`
        returned `future` for, what of them the engine still holds queued; the block's
        value is then `batching.types.Rows` (its rows' value, and which rows), which the
        caller unwraps before the outputs' shaper. False if nothing has it open."""
        ...

    async def generate(self, model: ModelEntry, text: Any,
                       params: dict[str, Any]) -> dict[str, Any]:
        """A whole generation: {"text_output", "finish_reason", "num_tokens", ...}."""
        ...

    def generate_stream(self, model: ModelEntry, text: Any,
                        params: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A generation's events; closing the iterator early cancels the generation."""
        ...
