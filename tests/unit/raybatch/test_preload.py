"""`raybatch up` imports Serve and the app on a thread while Ray starts: best effort."""

from __future__ import annotations

import sys

from raybatch.serving import _import_in_background


def test_modules_are_imported_on_the_thread_and_a_failure_stays_there(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    # the missing module stops the thread quietly: the caller imports it again and raises
    _import_in_background("colorsys", "no_such_module_here", "json").join(timeout=30)
    assert "colorsys" in sys.modules
    assert "no_such_module_here" not in sys.modules
