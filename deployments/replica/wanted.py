"""Whether a replica actor whose engine connection ended is still wanted, and leaving if not.

Why: the pool replaces a replica whose connection went silent (a host cut off, a process
stopped) with `ray.kill`, and Ray's GCS marks the actor DEAD at once; but the kill itself
must reach the replica's process through its node, and a process that was cut off or
stopped while it was sent can come back to life after Ray gave up on it (on a partitioned
host the kill never arrives; a stopped process was seen to miss it too). Such a process
holds its node's resources for nothing and, were a caller still connected, could answer.
So the replica asks for itself: when an engine's connection to it ends, it asks the GCS a
few times, backing off, whether its actor is still ALIVE, and leaves (closes its
connections, ends its process) once the GCS says it is DEAD. A connection that comes back
meanwhile (an engine that reconnects) ends the asking; an unreadable GCS is asked again.

The checks take their waits from `WAITS_S`, and sleep, ask and leave through callables a
test gives, so the logic runs on a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from cluster.spread import actor_record

log = logging.getLogger(__name__)

# Seconds before each question to the GCS after a connection ended: a replica replaced by
# the pool is DEAD in the GCS before its connection ends on a live host; the later asks
# cover a kill sent just after the engine closed the connection.
WAITS_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)


class WantedCheck:
    """Asks `is_dead()` after `connection_ended()`, at `waits_s`, while `connected()` is
    False; calls `leave(why)` once `is_dead()` says True. One round of asking at a time."""

    def __init__(self, is_dead: Callable[[], bool], connected: Callable[[], bool],
                 leave: Callable[[str], None], waits_s: Sequence[float] = WAITS_S,
                 sleep: Callable[[float], None] = time.sleep, background: bool = True) -> None:
        self.is_dead, self.connected, self.leave = is_dead, connected, leave
        self.waits_s, self.sleep, self.background = tuple(waits_s), sleep, background
        self.asked = 0  # questions put to the GCS, all rounds together
        self._lock = threading.Lock()
        self._running = False

    def connection_ended(self) -> None:
        """An engine's connection ended: start a round of asking unless one runs."""
        with self._lock:
            if self._running:
                return
            self._running = True
        if self.background:
            threading.Thread(target=self._round, name="replica-wanted", daemon=True).start()
        else:
            self._round()

    def _round(self) -> None:
        try:
            for wait in self.waits_s:
                self.sleep(wait)
                if self.connected():
                    return  # an engine is connected again: wanted
                self.asked += 1
                try:
                    dead = self.is_dead()
                except Exception as e:  # the GCS unreachable (a partition): ask again later
                    log.debug("asking the GCS whether this replica is wanted: %r", e)
                    continue
                if dead:
                    self.leave("the GCS holds this replica's actor DEAD (replaced or "
                               "stopped while its process could not be reached)")
                    return
        finally:
            with self._lock:
                self._running = False


def actor_is_dead(actor_id: str) -> bool:
    """Whether Ray's GCS holds actor `actor_id` (hex) DEAD (or no longer knows it)."""
    info = actor_record(actor_id)
    return not info or info.get("State") == "DEAD"
