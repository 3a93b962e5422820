"""Who may share a native HTTP port on a node: one app's processes, no one else's.

`deployments.http.pyserver.server` binds `ingress.native_port` with SO_REUSEPORT, so every
ingress replica of a node takes connections on it. The kernel would as gladly
spread connections across two different apps of the same user, giving one app's
clients the other's answers. `claim_port` keeps a small JSON file per port in the
node's temp folder, naming the app whose live processes hold it (a pid and its
start time, so a reused pid does not count), under a file lock: the node's replicas
start at once. A second app is refused with the fix in the message.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile

from cluster.pinning import process_alive, process_start


def claim_port(port: int, owner: str, folder: str | None = None) -> None:
    """Record that this process serves `owner` (an app) on `port`; raise RuntimeError if
    live processes of another owner hold it on this node (SO_REUSEPORT would mix them)."""
    path = os.path.join(folder or tempfile.gettempdir(), f"raybatch-native-port-{port}.json")
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # the node's replicas start concurrently
        f.seek(0)
        try:
            holders = json.loads(f.read() or "[]")
        except ValueError:
            holders = []
        live = [h for h in holders if isinstance(h, dict) and isinstance(h.get("pid"), int)
                and process_alive(h["pid"], h.get("start"))]
        others = sorted({str(h.get("owner")) for h in live} - {owner})
        if others:
            raise RuntimeError(
                f"port {port} (ingress.native_port) is served by app {others[0]!r} on this "
                f"node, and the kernel would split connections between it and {owner!r}: "
                "give each app its own ingress.native_port")
        me = os.getpid()
        live = [h for h in live if h["pid"] != me]
        live.append({"pid": me, "start": process_start(me), "owner": owner})
        f.seek(0)
        f.truncate()
        f.write(json.dumps(live))
