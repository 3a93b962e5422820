"""ModelStreamInfer without Ray or a network: tritonclient.grpc's own stream requests go
through `GrpcIngress.ModelStreamInfer` (as Serve calls it) to the real `ModelRoute`;
TinyLM generates in this process on the real iterative engine (`IngressPlacement` over an
in-process replica), `square` runs on a fake batching actor. A fake request stream
stands in for Serve's `gRPCInputStream`: requests sent, a half-close, a hang-up.
No sleeps: the tests turn the event loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cluster.config import ModelConfig, load_config
from deployments.grpc import GrpcIngress
from deployments.grpc.generate import FINAL
from deployments.ingress.placement import IngressPlacement
from deployments.models import Square
from tests.conftest import APP_CONFIG
from tests.conftest import arun as run
from tests.unit.deployments.grpc.test_generate import prompt, request, tensor
from tests.unit.deployments.grpc.test_servicer import FakeBatcher, Served, servicer
from tests.unit.deployments.test_placement import TINYLM, InProcessPool, spin


class Requests:
    """The client's side of the stream, as Serve hands it to the ingress method."""

    def __init__(self, *requests) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._hung_up = False
        for r in requests:
            self.send(r)

    def send(self, r) -> None:
        self._queue.put_nowait(r)

    def close(self) -> None:  # tritonclient's stop_stream(): no more requests
        self._queue.put_nowait(None)

    def hang_up(self) -> None:  # the proxy's session ended: the input says cancelled
        self._hung_up = True
        self._queue.put_nowait(None)

    def is_cancelled(self) -> bool:
        return self._hung_up

    def __aiter__(self):
        return self

    async def __anext__(self):
        r = await self._queue.get()
        if r is None:
            raise StopAsyncIteration
        return r


class Ingress(GrpcIngress):
    def __init__(self, models) -> None:
        self.grpc_servicer = servicer(models)


def lm(**batching) -> tuple[IngressPlacement, Served]:
    config = ModelConfig.model_validate({**TINYLM, "name": "tinylm",
                                         "batching": {**TINYLM["batching"], **batching}})
    backend = IngressPlacement(config, None, 1, make_pool=InProcessPool)
    served = Served(config, None)
    served.route = backend.route
    return backend, served


def square() -> Served:
    return Served(load_config(APP_CONFIG).model("square"), FakeBatcher(Square()))


def generate(text: bytes, request_id: str, **parameters):
    r = request(prompt(text), request_id=request_id, parameters=parameters)
    r.model_name = "tinylm"
    return r


def square_request(x, request_id="", model="square"):
    t = grpcclient.InferInput("INPUT0", [len(x)], "FP32")
    t.set_data_from_numpy(np.asarray(x, np.float32))
    r = request(t, request_id=request_id)
    r.model_name = model
    return r


def read(response):
    """(id, text or values or the error, final flag) of a ModelStreamInferResponse."""
    infer = response.infer_response
    final = infer.parameters[FINAL].bool_param
    if response.error_message:
        return infer.id, ("error", response.error_message), final
    result = grpcclient.InferResult(infer)
    out = result.as_numpy("text_output")
    if out is None:
        out = result.as_numpy("OUTPUT0")
        return infer.id, (None if out is None else out.tolist()), final
    return infer.id, out.ravel()[0].decode(), final


async def all_of(requests: Requests, models) -> list:
    requests.close()
    return [read(r) async for r in Ingress(models).ModelStreamInfer(requests, None)]


def test_a_stream_gives_token_for_token_what_generate_answers_and_flags_the_last():
    async def main():
        backend, served = lm()
        await backend.start()
        got = await all_of(Requests(generate(b"Once upon", "a", max_tokens=6)),
                           {"tinylm": served})
        return got, await backend.route.generate("Once upon", {"max_tokens": 6})

    got, whole = run(main())
    assert {i for i, _, _ in got} == {"a"}
    assert "".join(t for _, t, _ in got) == whole["text_output"]
    assert [f for _, _, f in got] == [False] * (len(got) - 1) + [True]
    # one response per step, the flag on the last step's text (not on an empty extra one)
    assert len(got) == whole["num_tokens"] == 6 and got[-1][1] != ""


def test_concurrent_generations_on_one_stream_each_get_their_own_text():
    prompts = {"a": (b"Once upon", 5), "b": (b"The cat", 9), "c": (b"Hello there", 3)}

    async def main():
        backend, served = lm()
        await backend.start()
        got = await all_of(Requests(*(generate(p, i, max_tokens=n)
                                      for i, (p, n) in prompts.items())), {"tinylm": served})
        alone = {i: (await backend.route.generate(p.decode(), {"max_tokens": n}))
                 ["text_output"] for i, (p, n) in prompts.items()}
        return got, alone

    got, alone = run(main())
    for i in prompts:
        mine = [(t, f) for j, t, f in got if j == i]
        assert "".join(t for t, _ in mine) == alone[i]
        assert [f for _, f in mine] == [False] * (len(mine) - 1) + [True]


def test_a_stateless_model_answers_each_request_once_and_errors_do_not_end_the_stream():
    async def main():
        backend, served = lm()
        await backend.start()
        models = {"square": square(), "tinylm": served}
        bad_param = generate(b"x", "bad-param")
        bad_param.parameters["max_tokens"].string_param = "many"
        no_prompt = request(tensor("max_tokens", np.array([3], np.int32), "INT32"),
                            request_id="no-p")
        no_prompt.model_name = "tinylm"
        return await all_of(Requests(
            square_request([1, 2, 3], "s1"), square_request([1], "lost", model="nope"),
            generate(b"x", "neg", max_tokens=-1), bad_param, no_prompt,
            square_request([4], "s2"), generate(b"Once", "ok", max_tokens=2)), models)

    got = run(main())
    by_id: dict = {}
    for i, value, final in got:
        by_id.setdefault(i, []).append((value, final))
    assert by_id["s1"] == [([1.0, 4.0, 9.0], True)] and by_id["s2"] == [([16.0], True)]
    errors = {i: v[0][0][1] for i, v in by_id.items() if v[0][0][0] == "error"}
    assert "Request for unknown model: 'nope' is not found" in errors["lost"]
    assert "max_tokens=-1 is out of range" in errors["neg"]
    assert "'max_tokens' must be an integer" in errors["bad-param"]
    assert "no input 'text_input'" in errors["no-p"]
    assert all(v == [(v[0][0], True)] for i, v in by_id.items() if i in errors)
    assert by_id["ok"][-1][1] is True and len(by_id["ok"]) >= 1


def test_a_hang_up_cancels_every_generation_and_one_still_waiting_never_starts():
    async def main():
        backend, served = lm(max_active=1)
        await backend.start()
        host = backend.engine.host
        requests = Requests(generate(b"Going on", "long", max_tokens=500),
                            generate(b"Queued", "queued", max_tokens=500))
        responses = Ingress({"tinylm": served}).ModelStreamInfer(requests, None)
        first = read(await responses.__anext__())
        await responses.aclose()  # Serve closes the method's generator: the client left
        at_once = host.stats()  # closing waited for every generation's cancel
        await spin()
        return first, at_once, host.stats()

    first, at_once, stats = run(main())
    assert first[0] == "long" and first[2] is False
    assert (at_once["open_requests"], at_once["cancelled"]) == (0, 2)
    assert (stats["active"], stats["waiting"], stats["open_requests"]) == (0, 0, 0)
    assert stats["cancelled"] == 2 and stats["completed"] == 0
    assert stats["step_tokens"] < 100


def test_an_input_that_says_cancelled_ends_the_stream_and_its_generations():
    async def main():
        backend, served = lm()
        await backend.start()
        requests = Requests(generate(b"Going on", "long", max_tokens=500))
        responses = Ingress({"tinylm": served}).ModelStreamInfer(requests, None)
        first = read(await responses.__anext__())
        requests.hang_up()
        rest = [read(r) async for r in responses]  # ends without running to 500 tokens
        await spin()
        return first, rest, backend.engine.host.stats()

    first, rest, stats = run(main())
    assert first[0] == "long" and not any(f for _, _, f in rest)
    assert (stats["active"], stats["cancelled"]) == (0, 1)
    assert stats["step_tokens"] < 100


def test_after_a_half_close_what_runs_still_answers():
    async def main():
        backend, served = lm()
        await backend.start()
        requests = Requests(generate(b"Once", "a", max_tokens=20))
        responses = Ingress({"tinylm": served}).ModelStreamInfer(requests, None)
        first = read(await responses.__anext__())
        requests.close()
        return [first] + [read(r) async for r in responses]

    got = run(main())
    assert got[-1][2] is True and sum(f for _, _, f in got) == 1


@pytest.mark.parametrize("empty_final", [False, True])
def test_triton_empty_final_response_is_sent_only_when_asked_for(empty_final):
    async def main():
        backend, served = lm()
        await backend.start()
        r = generate(b"Once", "a", max_tokens=3)
        if empty_final:
            r.parameters["triton_enable_empty_final_response"].bool_param = True
        requests = Requests(r)
        requests.close()
        return [x async for x in Ingress({"tinylm": served}).ModelStreamInfer(requests, None)]

    got = run(main())
    last = got[-1].infer_response
    assert last.parameters[FINAL].bool_param
    assert last.parameters["finish_reason"].string_param == "length"
    assert last.parameters["num_tokens"].int64_param == 3
    assert (len(last.outputs) == 0) is empty_final
    assert not any(r.infer_response.parameters[FINAL].bool_param for r in got[:-1])


def test_one_stream_runs_at_most_max_in_flight_requests_at_once():
    """A client sending 200 requests on one stream: the 65th is read only when one of the
    first 64 ends, so one stream holds bounded memory; every request is answered."""
    from deployments.grpc.stream import MAX_IN_FLIGHT, serve_stream

    async def main():
        gate, running, most = asyncio.Event(), 0, 0

        async def run_one(request, emit):
            nonlocal running, most
            running += 1
            most = max(most, running)
            await gate.wait()
            running -= 1
            emit(request)

        reqs = Requests(*range(200))
        reqs.close()
        out = serve_stream(reqs, run_one, lambda r, e: ("error", r))
        first = asyncio.ensure_future(out.__anext__())
        for _ in range(50):
            await asyncio.sleep(0)
        assert running == most == MAX_IN_FLIGHT and not first.done()
        gate.set()
        answers = [await first] + [r async for r in out]
        return sorted(answers), most

    answers, most = run(main())
    assert answers == list(range(200)) and most == MAX_IN_FLIGHT
