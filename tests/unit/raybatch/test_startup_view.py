"""What `raybatch up` shows while it deploys (`raybatch.startup`): why each actor is
pending, redrawn in place on a terminal, a line per change elsewhere."""

from __future__ import annotations

import io

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
