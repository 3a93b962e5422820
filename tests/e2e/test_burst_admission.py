"""A burst the model can serve within the wait bound is served, not refused (admission by
time, `limits.max_queue_wait_s`): 1,500 concurrent single-item requests to `square` on
Raybatch's own HTTP port all get 200 with their own answer. Under the count bound that
was the default before (8 batches of 64), about 580 were answered and the rest got 429.

The client is raw sockets (each request's bytes made before, one connection each, all
sent before any answer is read): the subject is the server's admission, and a client
that spends as much CPU per request as the server would take the two shared cores the
server serves the burst with (an aiohttp client of 1,500 connections did, and made the
burst slower than its bound on a busy machine)."""

from __future__ import annotations

import json
import selectors
import socket
import time
from collections import Counter

import pytest

from tests.unit.deployments.http.wire import parse_responses, request

pytestmark = pytest.mark.e2e

BURST = 1500


def burst(port: int, bodies: list[bytes], timeout_s: float = 60.0) -> list[tuple[int, object]]:
    """Send each body as its own POST on its own connection, all before reading any
    answer; then read each connection's one response. (status, data or error body)."""
    heads = [request("POST", "/v2/models/square/infer", body,
                     content_type="application/json") for body in bodies]
    socks = []
    for raw in heads:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock.sendall(raw)
        socks.append(sock)
    sel = selectors.DefaultSelector()
    got: dict[int, bytes] = {}
    out: dict[int, tuple[int, object]] = {}
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, i)
        got[i] = b""
    give_up = time.monotonic() + timeout_s
    while len(out) < len(socks) and time.monotonic() < give_up:
        for key, _ in sel.select(timeout=1.0):
            i = key.data
            chunk = key.fileobj.recv(65536)
            got[i] += chunk
            responses, _ = parse_responses(got[i])
            if responses or not chunk:
                sel.unregister(key.fileobj)
                if responses:
                    r = responses[0]
                    body = r.json()
                    out[i] = (r.status, body["outputs"][0]["data"] if r.status == 200 else body)
                else:
                    out[i] = (0, "closed without an answer")
    for sock in socks:
        sock.close()
    return [out.get(i, (0, "no answer in time")) for i in range(len(socks))]


def test_a_burst_of_1500_single_item_requests_is_all_served(app):
    port = app.config.ingress.native_port
    policy = app.config.models[[m.name for m in app.config.models].index("square")]
    assert policy.limits.max_queue_wait_s == 1.0  # the default under test

    bodies = [json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                      "data": [float(i)]}]}).encode() for i in range(BURST)]
    answers = burst(port, bodies)
    statuses = Counter(status for status, _ in answers)
    refused = [body for status, body in answers if status != 200][:3]
    assert statuses == {200: BURST}, (statuses, refused)
    assert all(data == [float(i * i)] for i, (_, data) in enumerate(answers))
