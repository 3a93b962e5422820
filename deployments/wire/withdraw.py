"""A partial cancel on the wire: the rows of a request to withdraw at the batching actor.

Why: a native-front block is one engine request standing for several clients' requests
(`deployments.http.native.blocks`). When some of those clients hang up, the rows of theirs
that the engine still holds queued are withdrawn (`batching.dynamic.withdraw`), rather than
the whole request cancelled (failing the clients left) or run whole (computing answers
nobody reads). The message rides with the plain cancels: a `Withdraw` in place of a key in
`BatcherActor.cancel(caller, keys)`, sent by the same way as its request (a Ray call or the
direct connection, `deployments.ingress.coalesce`), so the actor sees the request before
it, as it sees a request before its cancel. The answer of such a request says which rows
it carries (`batching.types.Rows`).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Withdraw(NamedTuple):
    """Withdraw the rows `rows` (indices into the request as sent) of the caller's request
    `key`, what of them is still queued. A tuple: it pickles as one."""

    key: Any
    rows: tuple[int, ...]


def key_of(cancel: Any) -> Any:
    """The request key a cancel names: itself, or a `Withdraw`'s."""
    return cancel.key if type(cancel) is Withdraw else cancel
