"""The native front feeding a model whose engine is in batching actors (`sharded`: two
shards, batches of 16, a 2 ms delay): its requests gather into blocks while a batch is in
flight (`deployments.http.native.gather`), and under a load of pipelined clients each still gets
its own answer, and the actors count every request once; the bundles go on the
ingress's direct connection to the actors (`batcher.link`), and the batches on each
actor's to its replicas (`replicas.link`: CPU replicas too)."""

from __future__ import annotations

import json
import selectors
import socket

import pytest

from deployments.http.native.front import available
from tests.unit.deployments.http.wire import parse_responses, request

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                 "(needs a C compiler): run `make setup` with gcc installed")]

CONNECTIONS, EACH = 96, 4


def body(x: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [x]}]}).encode()


def test_pipelined_clients_through_the_front_to_batching_actors_get_their_own_answers(app):
    port = app.config.ingress.native_port
    path = "/v2/models/sharded/infer"
    # the front learns the request's kind from the Python server's first answer
    first = socket.create_connection(("127.0.0.1", port), timeout=30)
    first.sendall(request("POST", path, body(-1.0)))
    assert first.recv(65536).startswith(b"HTTP/1.1 200")
    first.close()
    before = app.stats("sharded")
    queued_before = app.handle.front_counts.remote().result(timeout_s=30)["fast"]

    socks, sel = [], selectors.DefaultSelector()
    for c in range(CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"".join(request("POST", path, body(float(c * EACH + i)))
                              for i in range(EACH)))
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, c)
        socks.append(sock)
    got: dict[int, bytes] = {c: b"" for c in range(CONNECTIONS)}
    answers: dict[int, list] = {}
    while len(answers) < CONNECTIONS:
        ready = sel.select(timeout=30)
        assert ready, f"no answer for 30 s; {len(answers)} connections answered"
        for key, _ in ready:
            c = key.data
            chunk = key.fileobj.recv(65536)
            assert chunk, f"connection {c} closed before its answers"
            got[c] += chunk
            responses, _ = parse_responses(got[c])
            if len(responses) == EACH:
                sel.unregister(key.fileobj)
                answers[c] = responses
    for sock in socks:
        sock.close()

    served = 0
    for c, responses in answers.items():
        for i, r in enumerate(responses):
            x = float(c * EACH + i)
            if r.status == 429:  # admission by time: on a busy machine the burst's
                # measured wait can pass the model's bound; refused clearly, never lost
                assert "max_queue_wait_s" in r.json()["error"], (x, r.body)
                continue
            assert r.status == 200, (x, r.body)
            assert r.json()["outputs"][0]["data"] == [x * x]
            served += 1
    assert served > 0
    after = app.stats("sharded")
    assert after["success"]["count"] - before["success"]["count"] == served
    # ... and the front, not the Python server, queued them: the plan it learnt from the
    # first answer covers every later one (each sent whole in one write; a request the
    # front had to hand over, such as one cut across reads, would be the Python path's)
    queued = app.handle.front_counts.remote().result(timeout_s=30)["fast"] - queued_before
    assert queued >= 0.9 * CONNECTIONS * EACH, f"the front queued {queued} of {served}"
    # the bundles went on the ingress's direct connection to each batching actor
    assert after["linked_callers"] >= 1, after
    # and each batching actor sent its batches on a direct connection to its CPU replicas
    linked = [r.get("link_batches", 0) for r in after["replica_info"]]
    assert len(linked) == 2 and sum(linked) > 0, after["replica_info"]
