"""Who may share a native HTTP port on a node (`deployments.http.pyserver.portclaim`): one
app's live processes; the last to leave removes the port's file, and files that killed
servers left are removed by the next claim."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cluster.pinning import process_start
from deployments.http.pyserver.portclaim import claim_port, release_port
from tests.conftest import HANG_S, wait_until


def test_the_last_server_off_a_port_removes_its_file_and_a_waiter_reopens_it(tmp_path):
    folder = str(tmp_path)
    path = tmp_path / "raybatch-native-port-8200.json"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim_port(8200, "app-a", folder)
        # another live process of the same app holds it too
        held = json.loads(path.read_text())
        held.append({"pid": other.pid, "start": process_start(other.pid), "owner": "app-a"})
        path.write_text(json.dumps(held))
        release_port(8200, folder)  # this one stops: the other still holds the port
        assert [h["pid"] for h in json.loads(path.read_text())] == [other.pid]
    finally:
        other.kill()
        other.wait()
    release_port(8200, folder)  # the last live holder is gone: no file left
    assert not path.exists()
    release_port(8200, folder)  # again: nothing to do

    # a claim that waited on the lock while the last holder removed the file is written
    # to the file at the path, not to the removed one (where the next app would not see it)
    claim_port(8201, "app-a", folder)
    path = tmp_path / "raybatch-native-port-8201.json"
    release_port(8201, folder)

    def waited_on(inode: int) -> bool:
        return any("->" in line and f":{inode} " in line
                   for line in Path("/proc/locks").read_text().splitlines())

    with open(path, "a+") as stale:  # as the last holder's release_port has it
        fcntl.flock(stale, fcntl.LOCK_EX)
        waiter = threading.Thread(target=claim_port, args=(8201, "app-b", folder))
        waiter.start()  # opens the file and blocks on the lock held here
        inode = os.fstat(stale.fileno()).st_ino
        wait_until(lambda: waited_on(inode), timeout_s=30, every_s=0.01,
                   what="the claim to wait on the port file's lock")
        os.unlink(path)  # as release_port does, under the lock
    waiter.join(HANG_S)
    assert not waiter.is_alive()
    assert [h["owner"] for h in json.loads(path.read_text())] == ["app-b"]


def test_a_port_is_shared_by_one_apps_processes_only(tmp_path):
    claim_port(8123, "app-a", str(tmp_path))
    claim_port(8123, "app-a", str(tmp_path))  # this app's next replica: fine
    with pytest.raises(RuntimeError, match=r"served by app 'app-a'.*own ingress\.native_port"):
        claim_port(8123, "app-b", str(tmp_path))
    # a holder that is gone does not count
    (tmp_path / "raybatch-native-port-8124.json").write_text(
        json.dumps([{"pid": 2**22 + 7, "owner": "app-a"}]))
    claim_port(8124, "app-b", str(tmp_path))
    (tmp_path / "raybatch-native-port-8125.json").write_text("not json")
    claim_port(8125, "app-b", str(tmp_path))
    # a live pid that is another process than the one recorded (reused): does not count
    (tmp_path / "raybatch-native-port-8126.json").write_text(
        json.dumps([{"pid": os.getpid(), "start": "not-its-start", "owner": "app-a"}]))
    claim_port(8126, "app-b", str(tmp_path))


def test_a_claim_removes_the_files_that_killed_servers_left_and_no_other(tmp_path):
    folder = str(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a server killed before it could release its port
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        def holder(proc, port):
            path = tmp_path / f"raybatch-native-port-{port}.json"
            path.write_text(json.dumps([{"pid": proc.pid, "start": process_start(proc.pid),
                                         "owner": "app-a"}]))
            return path

        stale, held = holder(dead, 8300), holder(alive, 8301)
        busy = holder(dead, 8302)  # stale too, but another process has it locked now
        other = tmp_path / "unrelated.json"
        other.write_text("[]")
        with open(busy) as locked:
            fcntl.flock(locked, fcntl.LOCK_EX)
            claim_port(8303, "app-b", folder)
        assert not stale.exists()
        assert held.exists() and busy.exists() and other.exists()
        assert (tmp_path / "raybatch-native-port-8303.json").exists()
    finally:
        alive.kill()
        alive.wait()
