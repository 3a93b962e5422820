"""A local Ray's start tried again: what a failed try started (orphans included) is ended
before the next; the successful try's processes and anyone else's are left."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from cluster import localray
from tests.conftest import HANG_S

TIMEOUT = Exception("The current node timed out during startup. This could happen because "
                    "some of the Ray processes failed to startup.")


class FakeInit:
    """Stands in for ray.init: each call starts what a node would (a process, and an orphan:
    a process whose parent exited, as a dashboard agent whose raylet died), then raises
    the next of `errors`, or returns what it started (as ray.init its context) once they
    are used up."""

    def __init__(self, tmp_path, *errors: BaseException) -> None:
        self.tmp_path, self.errors, self.started = tmp_path, list(errors), []

    def __call__(self, **options) -> tuple:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        pidfile = self.tmp_path / f"orphan-{len(self.started)}"
        subprocess.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}"], check=True)
        self.started.append((child, psutil.Process(int(pidfile.read_text()))))
        if self.errors:
            raise self.errors.pop(0)
        return self.started[-1]


@pytest.fixture
def quiet_ray(monkeypatch):
    import ray

    shut: list[int] = []
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(1))
    return shut


def gone(p) -> bool:
    if isinstance(p, subprocess.Popen):
        p.poll()
        return p.returncode is not None
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_try_that_timed_out_is_ended_and_the_next_one_kept(tmp_path, quiet_ray):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    init, said, ended = FakeInit(tmp_path, TIMEOUT, TIMEOUT), [], []
    try:
        made = localray.start_local(init, say=said.append, ended=lambda: ended.append(1),
                                    num_cpus=2)
        assert made == init.started[2]  # the successful try's result is the caller's
        assert len(init.started) == 3 and len(said) == 2 and ended == [1, 1] == quiet_ray
        assert "try 1 of 3" in said[0] and "starting it again" in said[0]
        for child, orphan in init.started[:2]:
            child.wait(HANG_S)  # ended (this test reaps its own child)
            psutil.wait_procs([orphan], timeout=HANG_S)
            assert gone(child) and gone(orphan)
        assert not any(gone(p) for p in (*init.started[2], bystander))
        assert localray.MARK_ENV not in os.environ  # the mark was this start's only
    finally:
        for p in (bystander, *[p for pair in init.started for p in pair]):
            try:
                p.kill()
            except (ProcessLookupError, psutil.Error):
                pass
        bystander.wait()


def test_the_last_timeout_and_any_other_error_are_raised_at_once(tmp_path, quiet_ray):
    init = FakeInit(tmp_path, *[TIMEOUT] * localray.TRIES)
    try:
        with pytest.raises(Exception, match="timed out during startup"):
            localray.start_local(init, say=lambda what: None)
        assert len(init.started) == localray.TRIES
        other = FakeInit(tmp_path, ValueError("bad num_cpus"))
        with pytest.raises(ValueError, match="bad num_cpus"):
            localray.start_local(other, say=lambda what: None)
        init.started += other.started
        assert len(other.started) == 1
        stopped = FakeInit(tmp_path, TIMEOUT)  # Ctrl-C while Ray started: no second try
        with pytest.raises(Exception, match="timed out during startup"):
            localray.start_local(stopped, again=lambda: False, say=lambda what: None)
        init.started += stopped.started
        assert len(stopped.started) == 1
    finally:
        for child, orphan in init.started:
            child.kill()
            child.wait()
            try:
                orphan.kill()
            except psutil.Error:
                pass


def test_a_local_node_asks_the_os_for_its_dashboard_agents_port():
    """Ray builds a node's parameters in the one class `start_local` hands it: inside,
    the agent's fixed default port becomes 0 (the OS chooses), an explicit one is kept;
    after it, or after a failed try, Ray's own class is back."""
    from ray._private import parameter, ray_constants

    fixed = parameter.RayParams
    built: list = []

    def init(**options):  # ray.init builds the node's parameters as below
        built.append(parameter.RayParams(num_cpus=options["num_cpus"]))
        built.append(parameter.RayParams(dashboard_agent_listen_port=40123))
        return built

    localray.start_local(init, say=lambda what: None, num_cpus=2)
    assert built[0].dashboard_agent_listen_port == 0 and built[0].num_cpus == 2
    assert built[1].dashboard_agent_listen_port == 40123
    assert parameter.RayParams is fixed
    assert fixed().dashboard_agent_listen_port == \
        ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT

    def fails(**options):
        parameter.RayParams()
        raise ValueError("bad num_cpus")

    with pytest.raises(ValueError, match="bad num_cpus"):
        localray.start_local(fails, say=lambda what: None)
    assert parameter.RayParams is fixed
