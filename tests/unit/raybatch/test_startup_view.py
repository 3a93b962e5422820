"""What `raybatch up` shows while it deploys (`raybatch.startup`): why each actor is
pending, redrawn in place on a terminal, a line per change elsewhere."""

from __future__ import annotations

import io

from cluster.demands import bundle_key
from raybatch.startup import ProgressView, why_pending


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_why_an_actor_is_pending():
    gpu = {"label": "ModelReplica", "pid": 0, "resources": {"CPU": 2, "GPU": 0.5}}
    assert why_pending(gpu, {"CPU": 4}) == \
        "waiting for resources: asks CPU 2, GPU 0.5, free GPU 0"
    assert why_pending(gpu, {"CPU": 4, "GPU": 1}).startswith("starting a process")
    assert why_pending({**gpu, "pid": 42}, {"CPU": 4, "GPU": 1}) == \
        "initialising (model setup, then warm-up)"
    batcher = {"label": "BatcherActor", "pid": 0, "resources": {}}
    assert why_pending(batcher, {}) == "starting a process"
    assert why_pending({**batcher, "pid": 7}, {}) == "initialising"


def test_an_actor_waits_for_resources_only_where_ray_holds_its_ask_queued():
    """Ray takes an actor's resources before it starts its process: on 2 CPUs, with every
    actor's lease granted and their processes starting, free is below what each asks, yet
    none waits for resources. Ray's queue (its pending demands) tells which one does."""
    replica = {"label": "ModelReplica", "pid": 0, "resources": {"CPU": 0.5}}
    free = {"CPU": 0.45}
    assert why_pending(replica, free).startswith("waiting for resources")  # Ray said nothing
    assert why_pending(replica, free, {}) == "starting a process (CPU 0.5)"
    waiting = {bundle_key({"CPU": 0.5}): 1}
    assert why_pending(replica, free, waiting) == \
        "waiting for resources: asks CPU 0.5, free CPU 0.45"
    # one queued bundle of that shape: the next actor asking the same is starting, not waiting
    assert why_pending(replica, free, waiting).startswith("starting a process")
    # queued though the free reading (taken at another moment) would cover it: still waiting
    assert why_pending(replica, {"CPU": 2}, {bundle_key({"CPU": 0.5}): 1}) == \
        "waiting for resources: asks CPU 0.5, free CPU 2"
    # an actor a process runs holds its resources: it takes no queued bundle of its shape
    waiting = {bundle_key({"CPU": 0.5}): 1}
    assert why_pending({**replica, "pid": 9}, free, waiting).startswith("initialising")
    assert why_pending(replica, free, waiting).startswith("waiting for resources")
    batcher = {"label": "BatcherActor", "pid": 0, "resources": {}}
    assert why_pending(batcher, {}, {(): 3}) == "starting a process"  # asks nothing: never


def test_a_terminal_is_redrawn_in_place_and_a_pipe_gets_each_change_once():
    tty = Tty()
    view = ProgressView(tty)
    view.show(1, ["  Ingress: 1 starting"])
    view.show(2, ["  Ingress: 1 starting"])
    view.done("deployed in 2.0 s")
    assert tty.getvalue().count("\x1b[2F\x1b[J") == 2  # the 2 lines drawn, cleared twice
    assert tty.getvalue().endswith("deployed in 2.0 s\n")

    pipe = io.StringIO()
    view = ProgressView(pipe)
    for t, lines in ((1, ["  a"]), (2, ["  a"]), (3, ["  b"])):
        view.show(t, lines)
    view.done("deployed in 3.0 s")
    assert "\x1b" not in pipe.getvalue()
    assert pipe.getvalue().count("  a\n") == 1 and pipe.getvalue().count("  b\n") == 1
