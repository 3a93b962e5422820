"""Who may share a native HTTP port on a node: one app's processes, no one else's.

`deployments.http.pyserver.server` binds `ingress.native_port` with SO_REUSEPORT, so every
ingress replica of a node takes connections on it. The kernel would as gladly
spread connections across two different apps of the same user, giving one app's
clients the other's answers. `claim_port` keeps a small JSON file per port in the
node's temp folder, naming the app whose live processes hold it (a pid and its
start time, so a reused pid does not count), under a file lock: the node's replicas
start at once. A second app is refused with the fix in the message. A server that stops
takes its name off (`release_port`), and the last one removes the file: a node that runs
many apps over time, on many ports, keeps no file per port it ever served. A process
that waited on the lock of a file removed meanwhile opens the path again (the inode it
locked is checked against the path's), so no claim is written where no one reads it.
A process killed outright (SIGKILL, a node's OOM killer) cannot take its name off: each
claim also removes the files of other ports that no live process holds any more
(`_sweep`), so such files do not pile up either.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import tempfile
from collections.abc import Iterator
from typing import TextIO

from cluster.pinning import process_alive, process_start

PREFIX = "raybatch-native-port-"


def _path(port: int, folder: str | None) -> str:
    return os.path.join(folder or tempfile.gettempdir(), f"{PREFIX}{port}.json")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[TextIO]:
    """The port's file, open and locked: the one at `path` now (one removed by its last
    holder while this process waited for the lock is left, and the path opened again)."""
    while True:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # the node's replicas start concurrently
            try:
                same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield f
                return


def _live(f: TextIO) -> list[dict]:
    f.seek(0)
    try:
        holders = json.loads(f.read() or "[]")
    except ValueError:
        holders = []
    if not isinstance(holders, list):
        return []
    return [h for h in holders if isinstance(h, dict) and isinstance(h.get("pid"), int)
            and process_alive(h["pid"], h.get("start"))]


def _write(f: TextIO, holders: list[dict]) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps(holders))
    f.flush()


def claim_port(port: int, owner: str, folder: str | None = None) -> None:
    """Record that this process serves `owner` (an app) on `port`; raise RuntimeError if
    live processes of another owner hold it on this node (SO_REUSEPORT would mix them)."""
    with _locked(_path(port, folder)) as f:
        live = _live(f)
        others = sorted({str(h.get("owner")) for h in live} - {owner})
        if others:
            raise RuntimeError(
                f"port {port} (ingress.native_port) is served by app {others[0]!r} on this "
                f"node, and the kernel would split connections between it and {owner!r}: "
                "give each app its own ingress.native_port")
        me = os.getpid()
        live = [h for h in live if h["pid"] != me]
        live.append({"pid": me, "start": process_start(me), "owner": owner})
        _write(f, live)
    _sweep(folder, keep=port)


def _sweep(folder: str | None, keep: int) -> None:
    """Remove the files of ports other than `keep` that no live process holds (their
    holders were killed before they could release them). A file locked by another process
    (claiming or releasing it now) is left to that one; one removed here while another
    process waited to lock it is reopened there (`_locked`)."""
    for path in glob.glob(os.path.join(folder or tempfile.gettempdir(), f"{PREFIX}*.json")):
        if path == _path(keep, folder):
            continue
        try:
            with open(path) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino and not _live(f):
                    os.unlink(path)
        except OSError:  # removed meanwhile, or not ours to read or remove
            continue


def release_port(port: int, folder: str | None = None) -> None:
    """This process no longer serves `port`: its name taken off, and the file removed when
    no live process holds the port any more."""
    path = _path(port, folder)
    if not os.path.exists(path):
        return
    with _locked(path) as f:
        live = [h for h in _live(f) if h["pid"] != os.getpid()]
        if live:
            _write(f, live)
        else:
            os.unlink(path)  # under the lock: a waiter sees the inode gone and reopens
