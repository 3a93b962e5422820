"""`LocalApp`'s teardown: every step runs, in order, even when one fails (no Ray here)."""

from __future__ import annotations

import socket

import pytest

from deployments.local import free_port, run_all


def test_every_step_runs_and_the_first_failure_is_raised_after_them():
    ran = []

    def fail(name):
        def step():
            ran.append(name)
            raise OSError(f"{name} broke")
        return step

    with pytest.raises(RuntimeError, match="'delete the app' failed: OSError") as info:
        run_all([("delete the app", fail("delete")), ("shut Serve down", fail("serve")),
                 ("shut Ray down", lambda: ran.append("ray"))])
    assert ran == ["delete", "serve", "ray"]
    assert str(info.value.__cause__) == "delete broke"


def test_a_clean_teardown_raises_nothing():
    ran = []
    run_all([("a", lambda: ran.append("a")), ("b", lambda: ran.append("b"))])
    assert ran == ["a", "b"]


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
