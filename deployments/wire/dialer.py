"""How a caller gets its direct connection to an actor (`deployments.wire.link`): `Dialer` opens
one in the background the first time it is wanted, and until it is open (or for a while
after it could not be) the caller makes Ray calls; `listen_host` says where an actor
listens for a caller on a given Ray node. A caller whose `Dialer` is collected (a
`RaybatchClient` that dropped its route) closes its connection with it: an open
connection pings, and would stay open as long as the process.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from batching.loop import detached_task
from deployments.wire.bundles import node_id
from deployments.wire.endpoint import SAME_NODE
from deployments.wire.keepalive import Keepalive
from deployments.wire.link import Link

log = logging.getLogger(__name__)

RETRY_S = 10.0  # after a connection could not be opened, Ray calls until then
CONNECT_S = 10.0  # asking for the address and connecting, at most (no SYN answered: minutes)


def listen_host(caller_node: str | None) -> str:
    """Where an actor listens for a caller on Ray node `caller_node`: a Unix socket
    (`SAME_NODE`, `deployments.wire.endpoint`) when that is the actor's own node, else the
    node's address."""
    import ray

    if caller_node is not None and caller_node == node_id():
        return SAME_NODE
    return ray.util.get_node_ip_address()


class Dialer:
    """A caller's connection to one actor (its `link_address`), opened in the background
    the first time it is wanted (`dial`); until it is open, or for `RETRY_S` after it could
    not be (said once in the log), the caller makes Ray calls. `keepalive` and `on_lost`:
    each connection's (see `Link`); `ask(actor)`: its `confirm`, about the actor it is to."""

    def __init__(self, what: str, keepalive: Keepalive | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 ask: Callable[[Any], Awaitable[BaseException | None]] | None = None) -> None:
        self.what = what  # the actor, in the log
        self.keepalive, self.on_lost, self.ask = keepalive, on_lost, ask
        self.link: Link | None = None
        self._opening: asyncio.Task | None = None
        self._retry_at = 0.0
        self._warned = False
        self._finalizer: weakref.finalize | None = None

    def live(self) -> Link | None:
        """The connection, if it is open."""
        link = self.link
        return link if link is not None and not link.closed else None

    def dial(self, actor: Any, wanted: Callable[[], bool] = lambda: True) -> None:
        """Start opening a connection to `actor`, unless one is opening or it is too soon;
        it is kept once open if `wanted()` still says so (the actor was not replaced)."""
        if not hasattr(actor, "link_address"):
            return  # a stand-in (the engine in the ingress, `client._ViaIngress`): Ray calls
        if self._opening is None and asyncio.get_running_loop().time() >= self._retry_at:
            self._opening = detached_task(self._open(actor, wanted))

    async def _open(self, actor: Any, wanted: Callable[[], bool]) -> None:
        try:  # bounded: a peer that answers nothing (no SYN-ACK) would take minutes
            link = await asyncio.wait_for(self._connect(actor), CONNECT_S)
        except Exception as e:
            self._retry_at = asyncio.get_running_loop().time() + RETRY_S
            (log.debug if self._warned else log.warning)(
                "no direct connection to %s (%r): Ray calls instead; trying again every "
                "%.0f s", self.what, e, RETRY_S)
            self._warned = True
            return
        finally:
            self._opening = None
        if wanted():
            self.link = link
            if self._finalizer is not None:  # one at a time: the last link's
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _close, link)  # a dropped caller's too
        else:
            link.close()

    async def _connect(self, actor: Any) -> Link:
        address = await actor.link_address.remote(node_id())
        ask = self.ask
        return await Link.open_to(*address, keepalive=self.keepalive, on_lost=self.on_lost,
                                  confirm=None if ask is None else lambda: ask(actor))

    def drop(self, link: Link) -> None:
        """`link` ended: forget it (not a newer one)."""
        if self.link is link:
            self.link = None

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            _close(link)


def _close(link: Link) -> None:
    try:
        link.close()
    except RuntimeError:  # its loop has ended: so has the connection
        pass
