"""A host lost with a batching actor and a sequence's state on it: both come back clearly.

A lab of two worker hosts (benchmarks.cluster.lab). Only host 0 is joined when the app is
deployed, so what may run on any worker host (`labhost`) lands there: `nodesquare`'s
batching actor (`batcher: {placement: actor, resources: {labhost: 0.001}}`) and its
replica, and the replica of `accumulator` (Triton's simple_sequence: the running sum of
a sequence), whose batching actor is on the head. Host 1 joins next, with the same
resources: where they can come back. Then a sequence is started and stepped, 4 closed-loop
clients send `nodesquare` one item each with a 3 s deadline, and host 0 is killed:

- every `nodesquare` request ends by its deadline + 1 s with its own x² or a 503/504 with
  a JSON error (none wrong), and within BACK_S the batching actor runs again on host 1 and
  answers from a replica there (Serve's controller recreates the dead deployment-scoped
  actor; the ingress asks for its handle again after a failure);
- the sequence's next step, sent right after the kill, ends by its deadline + 1 s with a
  JSON error that says its state was lost and to start it again (410 SequenceLost), never
  an answer; so do later steps of it; a sequence started afterwards is answered with its
  own sums, from a replica on host 1, within BACK_S.

BACK_S is not a speed target (benchmarks/cluster/faults.py has those): it bounds a wait
that, without the behaviour, would be forever.
"""

from __future__ import annotations

import http.client
import json
import time

import pytest

from benchmarks.cluster.faults import GRACE_S, Load, app_config, host_of, serving
from benchmarks.cluster.lab import HEAD_IP, Lab
from tests.integration.test_cluster_faults import (
    DEADLINE_S,
    alive_on,
    assert_every_request_ended_well,
    readable_status,
    until,
)

# the lab's Ray head may take three tries to start on a busy machine, up to 120 s each
# (`Lab.start_head`): the suite's 300 s guard against a hang would end the test first
pytestmark = [pytest.mark.integration, pytest.mark.own_ray, pytest.mark.timeout(600)]

CLIENTS = 4
BACK_S = 120.0  # the batching actor, and a replica for new sequences, back on host 1 by then
SEQ = "accumulator"


@pytest.fixture(autouse=True)
def _needs_a_lab() -> None:
    why = Lab.available()
    if why:
        pytest.skip(why)


def config() -> dict:
    """`app_config(1)` with the batching actor on a worker host, and `accumulator`."""
    cfg = app_config(1)
    head = cfg["ingress"]["resources"]
    square = cfg["models"][0]
    square["batcher"] = {"placement": "actor", "num_cpus": 0, "resources": {"labhost": 0.001}}
    square["replicas"]["resources"] = {"labhost": 0.3}
    tensor = {"datatype": "INT32", "shape": [-1, 1]}
    cfg["models"].append({
        "name": SEQ, "transformer": "deployments.models:Accumulator",
        "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}],
        "batching": {"kind": "sequence", "strategy": "direct", "max_batch_size": 8,
                     "max_sequence_idle_s": 120.0},
        "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.1, "pin": "off",
                     "in_process": False, "resources": {"labhost": 0.3}},
        "batcher": {"placement": "actor", "num_cpus": 0, "resources": head}})
    return cfg


def step(port: int, sid: str, x: int, start: bool = False) -> tuple[int, dict, float]:
    """One step of sequence `sid` (input x, deadline DEADLINE_S): status, body, seconds."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1],
                                   "data": [x]}],
                       "parameters": {"sequence_id": sid, "sequence_start": start,
                                      "timeout": int(DEADLINE_S * 1e6)}})
    conn = http.client.HTTPConnection(HEAD_IP, port, timeout=DEADLINE_S + 10)
    t0 = time.monotonic()
    try:
        conn.request("POST", f"/v2/models/{SEQ}/infer", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        status, data = r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, {"exception": repr(e)}, time.monotonic() - t0
    finally:
        conn.close()
    try:
        doc = json.loads(data)
    except ValueError:
        doc = {"not_json": data[:200].decode(errors="replace")}
    return status, doc, time.monotonic() - t0


def total(doc: dict) -> int | None:
    try:
        return int(doc["outputs"][0]["data"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def assert_lost_clearly(outcome: tuple[int, dict, float], sid: str) -> None:
    status, doc, took = outcome
    assert took <= DEADLINE_S + GRACE_S, f"step of {sid} took {took:.1f} s: {outcome}"
    assert status == 410 and isinstance(doc.get("error"), str), outcome  # SequenceLost
    said = doc["error"].lower()
    assert f"sequence {sid!r}" in said and "sequence_start" in said, outcome
    assert "lost" in said or "state is gone" in said, outcome


def first_new_sequence(port: int) -> tuple[str, float]:
    """Start new sequences until one is answered (its own sum); every refusal before is
    a JSON error by the deadline (a start sent to the dead replica is lost with it)."""
    give_up, n = time.monotonic() + BACK_S, 0
    while True:
        sid, n = f"after-{n}", n + 1
        status, doc, took = step(port, sid, 3, start=True)
        if status == 200:
            assert total(doc) == 3, doc  # a start resets the sum to its input
            return sid, time.monotonic()
        assert took <= DEADLINE_S + GRACE_S and status >= 400 and "error" in doc, (status, doc)
        if time.monotonic() > give_up:
            pytest.fail(f"no new sequence answered {BACK_S} s after the kill: {status} {doc}")
        time.sleep(0.5)


def test_a_host_with_a_batching_actor_and_sequence_state_killed_comes_back_clearly(tmp_path):
    with serving(hosts=2, cpus=0.5, replicas=1, logs=tmp_path, config=config(),
                 joined=1) as app:
        host0, host1 = app.lab.address(0), app.lab.address(1)
        app.join(1)  # after the deploy: nothing of the app can be there yet
        st = readable_status(app)
        assert [b.get("node_ip") for b in st["batching_actors"]] == [host0], st
        until(lambda: app.replicas(SEQ) == [host0], 60, f"{SEQ}'s replica on host 0")
        port = app.native_port
        sums = [step(port, "s1", 5, start=True), step(port, "s1", 2), step(port, "s1", 4)]
        assert [(s, total(d)) for s, d, _ in sums] == [(200, 5), (200, 7), (200, 11)], sums
        app.lab.wait_nodes(app.head, 3, timeout_s=120)

        with Load(port, CLIENTS, DEADLINE_S) as load:
            until(lambda: any(o.verdict == "ok" for o in load.outcomes), 30, "an answer")
            killed_at = time.monotonic()
            app.lab.kill(0)
            dead_at = time.monotonic()  # no process of host 0 is left from here on
            assert_lost_clearly(step(port, "s1", 1), "s1")
            new_sid, new_at = first_new_sequence(port)
            assert_lost_clearly(step(port, "s1", 1), "s1")  # lost for good, not a fresh sum
            back = until(lambda: next((o for o in load.outcomes if o.verdict == "ok"
                                       and o.t0 > killed_at), None),
                         BACK_S - (time.monotonic() - killed_at), "an answer after the kill")
        outcomes = load.stop()
        print(f"nodesquare answered again {back.t1 - killed_at:.1f} s after the kill, a new "
              f"sequence {new_at - killed_at:.1f} s after")
        assert_every_request_ended_well(outcomes)
        # what was sent once host 0 was gone was answered by host 1 (a request sent while the
        # kill went on may still have been answered by host 0, as it should)
        after = [o for o in outcomes if o.verdict == "ok" and o.t0 > dead_at]
        assert all(host_of(o.tag) == host1 for o in after), after[:3]

        assert [(s, total(d)) for s, d, _ in [step(port, new_sid, 4)]] == [(200, 7)]
        restarted = step(port, "s1", 6, start=True)  # what the error told the client to do
        assert (restarted[0], total(restarted[1])) == (200, 6), restarted
        st = readable_status(app)
        assert [b.get("node_ip") for b in st["batching_actors"]] == [host1], st
        assert alive_on(st) == [host1], st.get("replica_info")
        seq = readable_status(app, SEQ)
        assert alive_on(seq) == [host1], seq.get("replica_info")
    assert Lab.leftovers() == []
