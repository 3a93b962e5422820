"""A new local Ray node, started again when a busy machine made it miss Ray's fixed waits.

Ray gives a new local node's raylet a fixed 30 s to register with its GCS
(`ray._private.node.Node`), and the raylet itself waits a fixed 15 s for its dashboard
agent to start (else it dies of a failed check); no setting of Ray lengthens either. A
machine whose cores are all busy can miss them (the agent's imports alone outlasted the
15 s beside two test lanes and a CPU hog on 2 cores: docs/development.md), and the same
start a moment later succeeds. So every place that starts a local Ray (`raybatch up`,
`LocalApp` in notebooks, the test session's Ray) starts it through `start_local`: up to
`TRIES` tries while the node does not register in time, any other failure raised at
once; `raybatch join` tries its `ray start` as many times, on the same words.

What a failed try started must not outlive it (a GCS on its port, an agent whose raylet
died): each try runs with a mark of its own in the environment, which every process Ray
starts inherits, orphans included, and the processes that carry it are ended before the
next try. `ray.shutdown()` cannot do that: a node that failed to start was never handed
to the driver.

Its dashboard agent's HTTP port is chosen by the OS, not Ray's fixed 52365: on a machine
where another Ray runs (a second `raybatch up`, a notebook's `LocalApp` beside the test
session's Ray), the agent found that port taken, tried it six times, and went on without
it; the raylet waits on the agent, so every such start took those retries longer and came
that much nearer the raylet's 15 s (docs/development.md has the figures). `ray.init`
takes no option for that port, so the one place Ray builds the node's parameters is given
it (`agent_port_from_os`); a local node starts without the dashboard, the one user of that
port.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TRIES = 3
TIMED_OUT = "timed out during startup"  # what ray.init raises when the node missed a wait
MARK_ENV = "RAYBATCH_LOCAL_RAY_TRY"  # in the environment of every process of one try


def start_local(init: Callable[..., Any], *, tries: int = TRIES,
                again: Callable[[], bool] = lambda: True,
                say: Callable[[str], None] = print,
                ended: Callable[[], None] | None = None, **options: Any) -> Any:
    """`init(**options)` (`ray.init` of a new local node; its result is returned), up to
    `tries` times while the node does not register in time (`TIMED_OUT`) and `again()`
    (false after Ctrl-C). Before each next try, `say` is told, Ray is shut down in this
    process, what the failed try started is ended, and then `ended()` is called (a caller's
    own cleanup). The last such failure, or any other, is raised."""
    import ray

    for n in range(1, tries + 1):
        mark = uuid.uuid4().hex
        old = os.environ.get(MARK_ENV)
        os.environ[MARK_ENV] = mark
        try:
            with agent_port_from_os():
                return init(**options)
        except Exception as e:
            if TIMED_OUT not in str(e) or n == tries or not again():
                raise
        finally:
            if old is None:
                os.environ.pop(MARK_ENV, None)
            else:
                os.environ[MARK_ENV] = old
        say(f"Ray's local node did not register in time (try {n} of {tries}; a busy "
            "machine?); ending what it started and starting it again")
        ray.shutdown()
        end_marked(mark)
        if ended is not None:
            ended()


@contextmanager
def agent_port_from_os() -> Iterator[None]:
    """While it is open, a node Ray builds in this process (`ray.init` of a new local node)
    has its dashboard agent listen on a port the OS chooses (0) instead of Ray's fixed
    default; a port given explicitly is kept."""
    from ray._private import parameter, ray_constants

    fixed = parameter.RayParams

    class RayParams(fixed):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if (self.dashboard_agent_listen_port
                    == ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT
                    and "dashboard_agent_listen_port" not in kwargs):
                self.dashboard_agent_listen_port = 0

    parameter.RayParams = RayParams
    try:
        yield
    finally:
        parameter.RayParams = fixed


def processes_with(name: str, value: str) -> list[Any]:
    """This user's processes (psutil; never this one) whose environment has `name`=`value`:
    how a run's or a try's processes are known, whatever they are called and whoever
    their parent is now (`raybatch.runs` finds a run's this way too)."""
    import psutil

    found, uid = [], os.getuid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid == os.getpid() or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if p.environ().get(name) == value:
                found.append(p)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found


def end(procs: list[Any], grace_s: float = 2.0) -> None:
    """SIGTERM `procs` (psutil), then SIGKILL whatever is left after `grace_s`."""
    import psutil

    for kill, wait_s in ((False, grace_s), (True, 2.0)):
        for p in procs:
            try:
                p.kill() if kill else p.terminate()
            except psutil.Error:
                pass
        _, procs = psutil.wait_procs(procs, timeout=wait_s)
        if not procs:
            return


def end_marked(mark: str, grace_s: float = 1.0) -> None:
    """End the processes of the try that carried `mark`."""
    end(processes_with(MARK_ENV, mark), grace_s)
