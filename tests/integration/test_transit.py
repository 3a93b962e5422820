"""A bundle's time on its way to a batching actor counts against its requests' deadlines.

Across real processes of one Ray node: each deadline is an instant of this driver's
monotonic clock, and the stamp (this driver's node id and that clock) is read by the
batching actor in its own process, where the same clock runs.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from batching.errors import Overloaded
from deployments.wire.bundles import Entry, node_id, stamp

pytestmark = pytest.mark.integration


def test_a_request_whose_deadline_passed_on_the_way_is_refused_and_the_rest_served(app):
    import ray

    _config, actors, _default = app.handle.route_info.remote("slowsquare").result(timeout_s=30)
    actor = actors[0]
    x = np.array([3.0], np.float32)
    assert stamp()[0] == node_id() is not None
    left_a_second_ago = (node_id(), time.monotonic() - 1.0)
    at = left_a_second_ago[1]  # each deadline: its timeout after the bundle left
    out = ray.get(actor.infer.remote([Entry(1, x, None, at + 0.5), Entry(2, x, None, at + 30.0),
                                      Entry(3, x, None, None)], None, left_a_second_ago),
                  timeout=60)
    by_key = {key: (value, error) for key, value, error in out}
    assert isinstance(by_key[1][1], Overloaded), by_key[1]
    assert "reaching its batching actor" in str(by_key[1][1])
    assert by_key[2][1] is None and by_key[2][0].tolist() == [9.0]
    assert by_key[3][1] is None and by_key[3][0].tolist() == [9.0]
    # Just sent: nothing is refused.
    sent = stamp()
    out = ray.get(actor.infer.remote([Entry(4, x, None, sent[1] + 0.5)], None, sent), timeout=60)
    assert out[0][2] is None and out[0][1].tolist() == [9.0], out
