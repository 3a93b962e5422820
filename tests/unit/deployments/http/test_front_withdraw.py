"""Clients of the native front that hang up while their block waits in the engine, over
real sockets and a real engine in this process (no Ray): a `LocalEngine` (`batcher.
placement: ingress`, behind its `ModelRoute`) over one replica the test holds busy and
whose batches it records. The gone clients' rows are withdrawn from the engine (the model
never sees them), each client left gets the squares of its own inputs, and each gone
request is counted 499. And the mapping of an answer's rows to the clients left, alone."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import numpy as np
import pytest

from batching.types import Rows
from cluster.config import ModelConfig
from deployments.http import HttpLimits, OipApp
from deployments.http.native.departures import outputs_of, rows_left
from deployments.http.native.front import FrontServer, available
from deployments.ingress.placement import LocalEngine
from deployments.ingress.route import ModelRoute
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.fakes import FakeBackend
from tests.unit.deployments.http.served import read_response
from tests.unit.deployments.http.test_front import binary
from tests.unit.deployments.http.test_front_safety import reset

needs_front = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                 "(needs a C compiler): run `make setup` with gcc installed")

INFER = "/v2/models/{model}/infer"  # as counted: by route template
CONFIG = {
    "name": "square", "transformer": "deployments.models:Square",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
    "batching": {"max_batch_size": 64, "max_queue_delay_s": 0.0},
    "replicas": {"max_inflight_batches": 1}, "batcher": {"placement": "ingress"},
}


class HeldSquares:
    """The model's one replica: squares a batch once `go` is set; keeps each batch's rows."""

    name = "square-0"

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.go.set()
        self.batches: list[list[float]] = []

    async def run(self, items):
        await self.go.wait()
        self.batches.append(np.asarray(items).ravel().tolist())
        return items * items, 0.0


class _Pool:
    def __init__(self, host, replica: HeldSquares) -> None:
        self.host, self.replica = host, replica

    async def start(self) -> None:
        self.host.add_replica(self.replica)

    def replaced(self, client) -> None:
        raise AssertionError("no replica dies here")


class EngineBackend(FakeBackend):
    """The fake backend, `square` served by the real engine (as `ServeBackend` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.replica = HeldSquares()
        config = ModelConfig.model_validate(CONFIG)
        self.engine = LocalEngine(config, make_pool=lambda config, host, record_metrics=False:
                                  _Pool(host, self.replica))
        self.route = ModelRoute(config, [], shards=[self.engine])  # as `IngressPlacement`'s

    def submit_infer(self, model, request, received_s=None, requests=1):
        route = self.route
        return route.submit(route.decoded_array(request.inputs, request.batch_size),
                            request.priority, request.timeout_s, None, received_s,
                            requests), route.outputs

    def withdraw_infer(self, model, future, rows):
        return self.route.withdraw(future, rows)


def _ask(port: int, values: list[float]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(binary(values))
    return sock


@needs_front
def test_clients_that_hang_up_have_their_rows_of_a_queued_block_withdrawn():
    n, leaving = 6, (1, 2, 4)

    async def main():
        backend = EngineBackend()
        app = OipApp(backend, HttpLimits())
        server = FrontServer(app, port=0, reuse_port=False, max_header_bytes=16 * 1024)
        await server.start()
        await backend.engine.start()
        try:
            engine = backend.engine.host.engine
            replica = backend.replica
            learn = await asyncio.to_thread(_ask, server.port, [1.0, 1.0])
            await until(lambda: server.stats()["plans"] == 1, "the plan learnt", 30)
            learn.close()
            replica.go.clear()  # the model holds each batch until the test lets it go
            busy = await asyncio.to_thread(_ask, server.port, [100.0, 100.0])
            await until(lambda: server.book.pending == 1 and not engine.queued_items,
                        "the busy request on the model", 30)
            # The block: n clients' requests taken in one wake-up. The loop is held (no
            # await) until the front has queued them all, so they reach Python together.
            clients = [_ask(server.port, [float(i), 10.0 + i]) for i in range(n)]
            give_up = time.monotonic() + 30
            while server.stats()["queued"] < n + 1 and time.monotonic() < give_up:
                time.sleep(0.005)
            await until(lambda: engine.queued_items == 2 * n, "one block queued", 30)
            assert engine.queued_requests == 1 and server.book.pending == 2
            for i in leaving:
                reset(clients[i])
            await until(lambda: engine.queued_items == 2 * (n - len(leaving)),
                        "the gone clients' rows withdrawn", 30)
            replica.go.set()
            answers = {}
            for i, sock in enumerate(clients):
                if i not in leaving:
                    reader, writer = await asyncio.open_connection(sock=sock)
                    answers[i] = await read_response(reader)
                    writer.close()
            await until(lambda: server.stats()["reserved"] == 0, "every slot freed", 30)
            busy.close()
            return replica.batches, answers, app.response_counts(), engine
        finally:
            await server.stop(1.0)
            await backend.engine.drain(1.0)

    batches, answers, counts, engine = run(main(), 90)
    stay = [i for i in range(n) if i not in leaving]
    assert batches[0] == [1.0, 1.0] and batches[1] == [100.0, 100.0]
    # what the model ran of the block: the rows of the clients left, and nothing else
    assert batches[2:] == [[v for i in stay for v in (float(i), 10.0 + i)]]
    for i in stay:
        assert answers[i].status == 200
        assert struct.unpack("<2f", answers[i].body[-8:]) == (i * i, (10.0 + i) ** 2)
    assert counts[(INFER, 499)] == len(leaving)
    assert counts[(INFER, 200)] == 2 + len(stay)  # the plan's, the busy one's, theirs
    assert engine.queued_items == 0


# -- an answer's rows mapped back to the clients left --------------------------------------
def shaped(value):
    return {"OUT": np.asarray(value)}


def test_each_client_left_gets_its_own_rows_by_index():
    left = np.array([True, False, True, True])  # client 1 went away; 2 rows a client
    whole = np.arange(8) * 10
    assert rows_left(whole, shaped, left, 2)["OUT"].tolist() == [0, 10, 40, 50, 60, 70]
    carried = Rows(np.array([0, 10, 40, 50, 60, 70]), np.array([0, 1, 4, 5, 6, 7]))
    assert rows_left(carried, shaped, left, 2)["OUT"].tolist() == [0, 10, 40, 50, 60, 70]
    # client 1's rows 2, 3 ran before they could be withdrawn: carried, not answered
    ran = Rows(np.array([0, 10, 20, 30, 40, 50, 60, 70]), np.arange(8))
    assert rows_left(ran, shaped, left, 2)["OUT"].tolist() == [0, 10, 40, 50, 60, 70]


@pytest.mark.parametrize("value", [
    Rows(np.array([0, 10, 40, 60, 70]), np.array([0, 1, 4, 6, 7])),  # client 2's row 5 lost
    Rows(np.array([]), np.array([], np.int64)),  # nothing carried
    Rows(np.array([0, 10, 40]), np.array([0, 1, 4, 5, 6, 7])),  # fewer values than rows
    np.arange(6),  # fewer rows than the block's
])
def test_an_answer_lacking_a_client_lefts_rows_is_an_error_never_another_clients(value):
    with pytest.raises(RuntimeError):
        rows_left(value, shaped, np.array([True, False, True, True]), 2)


def test_a_block_with_no_client_gone_is_answered_whole_and_checked_if_it_carries_rows():
    assert outputs_of(np.arange(4), shaped, None, 2, 2)["OUT"].tolist() == [0, 1, 2, 3]
    every = Rows(np.arange(4) * 10, np.arange(4))
    assert outputs_of(every, shaped, None, 2, 2)["OUT"].tolist() == [0, 10, 20, 30]
    with pytest.raises(RuntimeError):  # rows withdrawn of a client nobody saw leave
        outputs_of(Rows(np.arange(2), np.array([0, 1])), shaped, None, 2, 2)
