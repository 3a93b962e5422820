"""Triton's wording for the errors whose cause Triton names, so its clients recognise them.

Triton's clients and tests check how some messages start (`"Request for unknown
model"`, its example programs among them), so where a cause is one Triton names,
Raybatch's message starts with Triton's words, exactly as Triton's server
(triton-inference-server/core) builds them, and goes on with Raybatch's hint: what
the model takes, how to fix the request. One function per cause, used by every
front (HTTP, gRPC, the handle API), so both protocols say the same. The status
codes stay Raybatch's (`batching.errors`); the docs' protocol page lists both.
Queue full lives in the engine, which imports nothing of this package:
`batching.errors.QUEUE_FULL`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from batching.errors import QUEUE_FULL

__all__ = ["QUEUE_FULL", "dims", "no_correlation_id", "unexpected_input", "unexpected_shape",
           "unknown_model", "unknown_version", "wrong_datatype"]


MAX_DIMS_SHOWN = 16  # a client's shape is never echoed whole past this


def dims(shape: Sequence[int]) -> str:
    """A shape as Triton writes it: `[-1,16]` (a long one cut short).

    >>> dims((-1, 16)), dims(range(20))
    ('[-1,16]', '[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,...]')
    """
    shown = [str(d) for d in shape[:MAX_DIMS_SHOWN]]
    return "[" + ",".join(shown + (["..."] if len(shape) > MAX_DIMS_SHOWN else [])) + "]"


def unknown_model(name: str, served: Iterable[str]) -> str:
    return (f"Request for unknown model: '{name}' is not found; this server serves "
            f"{sorted(served)}")


def unknown_version(name: str, version: str, served_version: str) -> str:
    return (f"Request for unknown model: '{name}' version {version} is not found; it has "
            f"version '{served_version}', not '{version}': leave the version out or ask "
            "for that one")


def unexpected_input(name: str, model: str, inputs: Sequence[str]) -> str:
    return (f"unexpected inference input '{name}' for model '{model}'; its inputs are "
            f"{list(inputs)}")


def wrong_datatype(name: str, got: str, model: str, want: str) -> str:
    return (f"inference input '{name}' data-type is '{got}', but model '{model}' expects "
            f"'{want}'; convert the data to {want}")


def unexpected_shape(name: str, model: str, expected: Sequence[int], got: Sequence[int]) -> str:
    """Triton's words, then which dim differs (or the ranks) and what -1 means."""
    if len(got) != len(expected):
        why = f"rank {len(got)} but the model expects rank {len(expected)}"
    else:
        axis, want, have = next((i, w, g) for i, (g, w) in enumerate(zip(got, expected))
                                if w != -1 and g != w)
        why = f"dim {axis} must be {want}, not {have}"
    return (f"unexpected shape for input '{name}' for model '{model}'. Expected "
            f"{dims(expected)}, got {dims(got)}: {why} (-1 = any size)")


def no_correlation_id(model: str) -> str:
    return (f"inference request to model '{model}' must specify a non-zero or non-empty "
            f"correlation ID; model '{model}' is stateful: every request needs a "
            "sequence_id (a positive integer or a non-empty string), and "
            "sequence_start=true on a sequence's first request")


def one_item_per_sequence(model: str, items: int) -> str:
    return (f"model {model!r} is stateful: a request carries one item of one sequence, got "
            f"{items}; send them one by one")


def generative_only(model: str) -> str:
    return (f"model {model!r} is generative: use generate or generate_stream "
            f"(POST /v2/models/{model}/generate)")
