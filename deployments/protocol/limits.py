"""How much one request may carry, and how much of a bad value a message repeats.

Both bound what a hostile client can make the server do. `RequestLimits` is checked
while a request is decoded, BEFORE anything is allocated for it: a shape's element
count is a product of numbers the client chose, so `[10**12]` must be refused from
the shape alone, never by trying `np.empty`. `shown` renders a client's value for an
error message with bounded depth and length: a 1,000-deep list would make `repr`
raise `RecursionError` (a 500), and a 60 MB one would be echoed whole.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one infer request may carry (the ingress builds it from `IngressConfig`).

    >>> RequestLimits(max_body_bytes=1 << 20).max_elements
    67108864
    """

    max_body_bytes: int = 64 * 2**20
    max_elements: int = 2**26
    """Elements of all input tensors together (the sum of their shapes' products)."""
    max_items: int = 65_536
    """Items (the leading, batch dim) of one request."""


def shown(value: Any) -> str:
    """`repr(value)`, cut short in depth and length, for error messages.

    >>> shown(list(range(100)))
    '[0, 1, 2, 3, 4, 5, 6, 7, ...]'
    """
    return _REPR.repr(value)
