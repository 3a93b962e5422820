"""Clients of the native front that hung up with requests queued: their requests dropped,
cancelled or withdrawn from the engine, and the answers of those left mapped back to them.

Why: a block is one engine request standing for several clients' requests
(`deployments.http.native.blocks`). Cancelling it when one of them hangs up would fail the
others; running it whole computes answers nobody reads. So: requests still gathering are
dropped; a block whose every client went away is cancelled in the engine (what it has not
started never runs); a block with a client left has the rows of the gone clients withdrawn
from what the engine still holds queued (`batching.dynamic.withdraw`, in this process or,
across a hop, by a partial cancel: `deployments.wire.withdraw`), and those already in a
batch run, their answers dropped. Where nothing can be withdrawn (the rows are running, or
the backend cannot) the block runs whole, as before.

Answers: each client left gets exactly its own rows. The engine's answer to a block some of
whose rows were withdrawn says which rows it carries (`batching.types.Rows`); a client's
rows are found there by index, never by position, and a client left whose rows it lacks
(never: only the gone clients' rows are withdrawn) fails rather than take another's. Each
gone client's request is counted 499, as the Python server counts a client that hung up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from batching.types import Rows
from deployments.http.native.gather import connection_of

log = logging.getLogger("deployments.http")


def rows_of(clients: np.ndarray, per: int) -> np.ndarray:
    """The item rows of a block's requests `clients` (their indices), `per` rows each."""
    return (np.asarray(clients, np.int64)[:, None] * per + np.arange(per)).ravel()


def gone(book: Any, prefix: int) -> None:
    """A client went away with requests queued (`prefix`: its tokens >> 24), as the note
    says; `book`: the server's `Blocks`."""
    mine_of = connection_of(prefix)
    for g in book.gathers.values():
        for pid in list(g.held):
            tokens = g.drop(pid, mine_of, book.plans[pid].size)
            if len(tokens):
                book._drop(book.plans[pid], tokens.tobytes(), len(tokens))
    oip = book.server.oip
    withdraw = getattr(oip.backend, "withdraw_infer", None) if oip is not None else None
    for future, flight in book.flying.items():
        tokens, was, plan = flight
        mine = mine_of(tokens)
        if not mine.any():
            continue
        flight[1] = left = mine if was is None else was | mine
        if left.all():
            future.cancel()
        elif withdraw is not None:
            try:
                withdraw(plan.model, future, rows_of(np.flatnonzero(mine), plan.rows))
            except Exception:  # the rows then run, their answers dropped
                log.exception("withdrawing the rows of clients that went away failed")


def outputs_of(value: Any, outputs: Callable[[Any], dict[str, np.ndarray]],
               left: np.ndarray | None, k: int, per: int) -> dict[str, np.ndarray]:
    """The outputs to answer a block of `k` requests with: of all of them (`left` None:
    none went away) or of those `left`, by index where the value is `Rows`."""
    if left is None and type(value) is not Rows:
        return outputs(value)
    return rows_left(value, outputs, np.ones(k, bool) if left is None else left, per)


def rows_left(value: Any, outputs: Callable[[Any], dict[str, np.ndarray]],
              left: np.ndarray, per: int) -> dict[str, np.ndarray]:
    """The outputs of a block's clients `left` (a mask over its requests, `per` rows
    each) from the engine's value for it: all its rows, or `Rows` (those it carries)."""
    carried = None
    if type(value) is Rows:
        value, carried = value.value, np.asarray(value.rows, np.int64)
    outs = outputs(value)
    want = rows_of(np.flatnonzero(left), per)
    size = len(left) * per if carried is None else len(carried)
    if carried is not None:
        at = np.minimum(np.searchsorted(carried, want), max(size - 1, 0))
        if size == 0 or (carried[at] != want).any():
            raise RuntimeError("the engine's answer to a block lacks rows of a client still "
                               "waiting for it")
        want = at
    for name, array in outs.items():
        if len(array) != size:
            raise RuntimeError(f"the engine answered {len(array)} rows of output {name!r} "
                               f"for a block of {size}")
    return {name: array[want] for name, array in outs.items()}
