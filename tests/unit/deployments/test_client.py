"""`RaybatchClient` for a model whose engine runs in the ingress (`batcher.placement:
ingress`): no batching actor to reach, so each coalesced bundle goes through the app's
handle (`Ingress.infer_entries`). No Ray: a fake handle answers as the ingress would."""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from cluster.config import ModelConfig
from deployments.ingress.client import RaybatchClient
from deployments.wire.bundles import Outcome, Stacked, entries, pack_outcomes

CONFIG = ModelConfig.model_validate({
    "name": "sq", "transformer": "deployments.models:Square",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
    "batching": {"max_batch_size": 8}, "batcher": {"placement": "ingress"}})


class _Call:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self.fn(*args))


class FakeIngressHandle:
    """`route_info` says the engine runs in the ingress; `infer_entries` squares each
    entry's items, answering `(key, value, error)` per entry as the ingress does."""

    def __init__(self) -> None:
        self.bundles: list[tuple[str, list]] = []
        self.route_info = _Call(self._route_info)
        self.infer_entries = _Call(self._infer_entries)

    async def _route_info(self, model):
        return CONFIG.model_dump_json(), None, None

    async def _infer_entries(self, model, bundle, sent=None):
        """As `Ingress.infer_entries` reads and answers a bundle, either form."""
        self.bundles.append((model, bundle))
        return pack_outcomes(bundle, [Outcome(key, np.asarray(items) ** 2)
                                      for key, items, *_ in entries(bundle)])


def test_requests_of_one_tick_reach_the_ingress_as_one_bundle_with_their_own_answers():
    handle = FakeIngressHandle()

    async def main():
        client = RaybatchClient(handle)
        xs = [np.array([float(i)], np.float32) for i in range(5)]
        return await asyncio.gather(*(client.infer("sq", {"INPUT0": x}) for x in xs))

    outs = asyncio.run(main())
    assert [o["OUTPUT0"].tolist() for o in outs] == [[float(i * i)] for i in range(5)]
    assert [(m, len(b)) for m, b in handle.bundles] == [("sq", 5)]
    assert type(handle.bundles[0][1]) is Stacked  # one array of 5 rows, not 5 arrays


def test_a_cancelled_request_is_dropped_here_quietly_and_the_next_one_still_runs(caplog):
    handle = FakeIngressHandle()

    async def main():
        client = RaybatchClient(handle)
        await client.infer("sq", {"INPUT0": np.ones(1, np.float32)})  # the route, fetched
        task = asyncio.ensure_future(client.infer("sq", {"INPUT0": np.ones(1, np.float32)}))
        for _ in range(3):  # sent in a bundle
            await asyncio.sleep(0)
        task.cancel()
        for _ in range(3):  # the cancel flushed
            await asyncio.sleep(0)
        out = await client.infer("sq", {"INPUT0": np.full(1, 3.0, np.float32)})
        return task, out

    with caplog.at_level(logging.WARNING):
        task, out = asyncio.run(main())
    assert out["OUTPUT0"].tolist() == [9.0] and task.cancelled()
    assert len(handle.bundles) == 3
    assert not [r for r in caplog.records if "cancel" in r.getMessage()], caplog.text


LM = ModelConfig.model_validate({
    "name": "lm", "transformer": "deployments.models:TinyLM",
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
    "batching": {"kind": "iterative", "max_active": 4}, "batcher": {"placement": "ingress"}})


class _Stream:
    """A streaming handle call's response: `n` events then the final one; `cancel()`."""

    def __init__(self, n: int) -> None:
        self.n, self.sent, self.cancelled = n, 0, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.cancelled or self.sent > self.n:
            raise StopAsyncIteration
        self.sent += 1
        if self.sent > self.n:
            return {"text_output": "", "final": True, "finish_reason": "length",
                    "num_tokens": self.n, "prompt_tokens": 1}
        return {"text_output": "x", "index": self.sent - 1}

    def cancel(self) -> None:
        self.cancelled = True


class FakeStreamingHandle:
    """An ingress whose generative model runs in it: `generate_stream` is a streaming
    handle call (`handle.options(stream=True)`), one per generation."""

    def __init__(self) -> None:
        self.route_info = _Call(self._route_info)
        self.streams: list[tuple[tuple, _Stream]] = []
        self.generate_stream = None  # only on the streaming handle (`options`)

    async def _route_info(self, model):
        return LM.model_dump_json(), None, None

    def options(self, stream: bool = False):
        assert stream, "generate_stream is a streaming call"
        streaming = FakeStreamingHandle()
        streaming.generate_stream = _Call(None)
        streaming.generate_stream.remote = self._generate_stream
        return streaming

    def _generate_stream(self, model, prompt, params):
        response = _Stream(params["max_tokens"])
        self.streams.append(((model, prompt, params), response))
        return response


def test_generations_of_an_ingress_placed_model_stream_through_the_handle():
    handle = FakeStreamingHandle()

    async def main():
        client = RaybatchClient(handle)
        whole = await client.generate("lm", "Once", {"max_tokens": 3})
        events = client.generate_stream("lm", "Once", {"max_tokens": 50})
        first = [await events.__anext__() for _ in range(2)]
        await events.aclose()  # hung up: the handle call is cancelled
        return whole, first

    whole, first = asyncio.run(main())
    assert (whole["text_output"], whole["num_tokens"]) == ("xxx", 3)
    assert [e["index"] for e in first] == [0, 1]
    (_, done), (call, hung_up) = handle.streams
    assert call == ("lm", "Once", {"max_tokens": 50})
    assert not done.cancelled and hung_up.cancelled


class Killed(Exception):
    """What Ray raises for a call to an actor ended with `ray.kill` (its wording)."""

    def __str__(self) -> str:
        return ("The actor died unexpectedly before finishing this task.\n"
                "The actor is dead because it was killed by `ray.kill`.")


class FakeBatcher:
    """A batching actor: `infer.remote` squares each entry, or fails with `error`."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.calls = error, 0
        self.infer = _Call(self._infer)

    async def _infer(self, bundle, caller=None, sent=None):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return pack_outcomes(bundle, [Outcome(key, np.asarray(items) ** 2)
                                      for key, items, *_ in entries(bundle)])


class FakeActorHandle:
    """`route_info` hands out the batching actors of `versions` in turn (a redeploy)."""

    def __init__(self, *versions: FakeBatcher) -> None:
        self.versions, self.fetches = list(versions), 0
        self.route_info = _Call(self._route_info)

    async def _route_info(self, model):
        actor = self.versions[min(self.fetches, len(self.versions) - 1)]
        self.fetches += 1
        config = CONFIG.model_copy(update={"batcher": CONFIG.batcher.model_copy(
            update={"placement": "actor"})})
        return config.model_dump_json(), [actor], None


def test_a_request_whose_batching_actor_serve_ended_goes_to_the_new_version(caplog):
    # Serve ends a stopped version's batching actor after its drain: a bundle still on its
    # way had not run there, so it is sent again, on the route fetched anew.
    old, new = FakeBatcher(Killed()), FakeBatcher()
    client = RaybatchClient(FakeActorHandle(old, new))
    with caplog.at_level(logging.CRITICAL, logger="deployments.ingress.coalesce"):
        out = asyncio.run(client.infer("sq", {"INPUT0": np.array([3.0], np.float32)}))
    assert out["OUTPUT0"].tolist() == [9.0]
    assert old.calls == 1 and new.calls == 1


def test_a_batching_actor_that_crashed_fails_its_requests_with_worker_died(caplog):
    from batching.errors import WorkerDied
    from deployments.ingress.coalesce import BatcherStopped

    crashed, new = FakeBatcher(RuntimeError("the actor died: SIGKILL")), FakeBatcher()
    client = RaybatchClient(FakeActorHandle(crashed, new))

    async def main():
        try:
            await client.infer("sq", {"INPUT0": np.array([3.0], np.float32)})
        except WorkerDied as e:
            return e
    with caplog.at_level(logging.CRITICAL, logger="deployments.ingress.coalesce"):
        error = asyncio.run(main())
    # it may have run: not sent again (the next call fetches the route anew)
    assert isinstance(error, WorkerDied) and not isinstance(error, BatcherStopped)
    assert crashed.calls == 1 and new.calls == 0
