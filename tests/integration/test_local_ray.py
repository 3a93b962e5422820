"""The session's local Ray, started as `raybatch up` starts one (`cluster.localray`): its
dashboard agent serves HTTP on a port the OS chose, not Ray's fixed one, which a second Ray
on the machine would find taken (and wait ~3 s on, retrying it, before going on without)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_the_session_rays_dashboard_agent_serves_on_a_port_of_its_own(ray_address):
    import ray
    from ray._private import ray_constants
    from ray.dashboard import consts
    from ray.experimental.internal_kv import _internal_kv_get

    node = ray.get_runtime_context().get_node_id()
    # what the agent wrote once its servers ran: [ip, http port (-1: none), grpc port]
    told = _internal_kv_get(f"{consts.DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX}{node}",
                            namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    assert told is not None, "the session node's dashboard agent never said its ports"
    _, http_port, _ = json.loads(told)
    assert http_port > 0, "the agent went on without its HTTP server"
    assert http_port != ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT
