"""The end-of-run account of what Ray did, read from a session's log folder."""

from __future__ import annotations

import os

from tests.ray_evidence import summary

RAYLET = """\
[2026-11-30 17:40:24,891 I 3380 3415] (raylet) threshold_memory_monitor.cc:128: Node memory usage above threshold
[2026-11-30 17:40:25,310 I 3380 3380] (raylet) node_manager.cc:3199: Killing 2 worker(s), kill details: Memory on the node (IP: 10.0.0.1, ID: ab) was 22.41GB used / 23.54GB limit (0.951797)
Selected to kill: (Actor(90cf), job ID=01000000, lease ID=00, task name=SERVE_CONTROLLER_ACTOR:ServeController.__init__, required resources={node:__internal_head__: 0.001}, pid=3481, actual memory used=0.09GB, worker ID=47)
Selected to kill: (Actor(42b6), job ID=01000000, lease ID=15, task name=StepReplica.__init__, required resources={CPU: 0.2}, pid=4753, actual memory used=0.21GB, worker ID=09)
"""  # noqa: E501


def test_kills_and_controller_restarts_are_told_and_a_quiet_session_says_nothing(tmp_path):
    assert summary(tmp_path) == []
    (tmp_path / "raylet.out").write_text(RAYLET)
    serve = tmp_path / "serve"
    serve.mkdir()
    (serve / "controller_3481.log").write_text("INFO 2026 controller 3481 -- starting\n")
    (serve / "controller_5566.log").write_text("INFO 2026 controller 5566 -- starting\n"
                                               "WARNING 2026 controller 5566 -- slow\n")
    os.utime(serve / "controller_3481.log", (1, 1))  # the older of the two
    lines = summary(tmp_path)
    assert lines[0] == f"---- what Ray did in the session ({tmp_path}) ----"
    assert lines[1:4] == [
        "Ray's memory monitor killed 2 worker(s): Memory on the node (IP: 10.0.0.1, ID: ab) "
        "was 22.41GB used / 23.54GB limit (0.951797)",
        "  killed: SERVE_CONTROLLER_ACTOR:ServeController.__init__ (pid 3481)",
        "  killed: StepReplica.__init__ (pid 4753)"]
    assert lines[4] == ("Serve's controller started 2 times (it died and Ray restarted it): "
                        "controller_3481.log, controller_5566.log")
    assert lines[5:] == ["the last WARNING and ERROR lines of controller_5566.log:",
                         "  WARNING 2026 controller 5566 -- slow"]
