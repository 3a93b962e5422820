"""Keepalive of a direct connection (`deployments.wire.link`): when its caller pings, and when
it takes the connection for lost.

Why: a peer whose host loses power, or is cut off by a partition, sends no FIN or RST;
without a heartbeat the caller waits on its open calls until something else gives up
(`replicas.batch_timeout_s`, minutes). So the caller's side (`Link`) keeps a `Heartbeat`:
after `ping_s` without a byte from the peer it sends a PING (an empty frame the peer
answers at once with a PONG, off its own event loop: it carries no work), and after
`dead_s` without a byte while a call is open or a ping unanswered it declares the
connection lost (`LinkLost` for every open call, the connection aborted). A healthy
idle connection is never lost: its pongs keep it heard. Bytes leaving this side's send
buffer count as heard too (the peer's kernel took them: a large frame in transit is
not silence). The decision is a state machine handed `now` (`check`), ticked by one
timer per connection every `ping_s / 2`, never one per call.

TCP keepalive (and `TCP_USER_TIMEOUT`: data unacknowledged for `USER_TIMEOUT_S` or
`4 * dead_s` ends the connection; loose, as a peer's loop stalled a few seconds must not
end it) is set on both ends as a second guard: it also lets an actor see a caller that
vanished (the actor does not ping).
"""

from __future__ import annotations

import enum
import math
import socket
from dataclasses import dataclass
from typing import Any

USER_TIMEOUT_S = 10.0  # TCP_USER_TIMEOUT, at least


@dataclass(frozen=True, slots=True)
class Keepalive:
    """A connection's heartbeat settings (`replicas.link_ping_s`, `replicas.link_dead_s`)."""

    ping_s: float = 0.5
    dead_s: float = 2.0

    @classmethod
    def of(cls, replicas: Any) -> Keepalive:
        """From a model's `ReplicaConfig`."""
        return cls(replicas.link_ping_s, replicas.link_dead_s)


DEFAULT = Keepalive()  # the config's defaults


class Verdict(enum.Enum):
    QUIET = "quiet"  # nothing to do
    PING = "ping"  # send a ping now
    LOST = "lost"  # the peer stopped answering: end the connection


class Heartbeat:
    """The caller's side of one connection's keepalive.

    >>> hb = Heartbeat(Keepalive(0.5, 2.0), now=0.0)
    >>> hb.check(0.4, outstanding=True), hb.check(0.5, outstanding=True)
    (<Verdict.QUIET: 'quiet'>, <Verdict.PING: 'ping'>)
    >>> hb.check(2.0, outstanding=True)
    <Verdict.LOST: 'lost'>
    """

    __slots__ = ("_buffered", "dead_s", "heard_s", "ping_s", "ping_sent_s")

    def __init__(self, keepalive: Keepalive, now: float) -> None:
        self.ping_s, self.dead_s = keepalive.ping_s, keepalive.dead_s
        self.heard_s = now  # the last byte from the peer (or the connection's start)
        self.ping_sent_s: float | None = None  # a ping not answered yet
        self._buffered = 0

    def heard(self, now: float) -> None:
        """Bytes came from the peer."""
        self.heard_s = now

    def answered(self, now: float) -> None:
        """The peer answered a ping."""
        self.heard_s = now
        self.ping_sent_s = None

    def check(self, now: float, outstanding: bool, buffered: int = 0) -> Verdict:
        """What to do at `now`; `outstanding`: calls open on the connection; `buffered`:
        bytes waiting in this side's send buffer."""
        if buffered < self._buffered:  # the peer's kernel took some: its host is up
            self.heard_s = now
        self._buffered = buffered
        silent = now - self.heard_s
        if silent >= self.dead_s and (outstanding or self.ping_sent_s is not None):
            return Verdict.LOST
        if silent >= self.ping_s and self.ping_sent_s is None:
            self.ping_sent_s = now
            return Verdict.PING
        return Verdict.QUIET

    def silence(self, now: float) -> str:
        return (f"nothing heard on the direct connection for {now - self.heard_s:.1f} s "
                f"(replicas.link_dead_s={self.dead_s:g}"
                f"{', a ping unanswered' if self.ping_sent_s is not None else ''})")

    def why(self, now: float) -> str:
        return f"{self.silence(now)}: the other end is gone or cut off"


def tcp_keepalive(sock: socket.socket | None, keepalive: Keepalive) -> None:
    """TCP keepalive probes after about `dead_s` idle, and `TCP_USER_TIMEOUT` (Linux): the
    kernel ends a connection whose peer stopped acknowledging, if the heartbeat did not
    first. Options a platform lacks are skipped. A Unix socket (a link on one node,
    `deployments.wire.endpoint`) gets none: its peer's end closes with its process, and
    the heartbeat covers a peer that stops without dying."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    whole_s = max(1, math.ceil(keepalive.dead_s))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", whole_s), ("TCP_KEEPINTVL", 1),
                        ("TCP_KEEPCNT", whole_s),
                        ("TCP_USER_TIMEOUT",
                         int(1000 * max(USER_TIMEOUT_S, 4 * keepalive.dead_s)))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:  # not a TCP socket (a test's), or not allowed here
            return
