"""The Coalescer against a fake batching actor: bundles, cancels, a lost actor.

No Ray: the fake actor's `infer.remote` / `cancel.remote` record each call and
return a future the test resolves; the loop only turns with `asyncio.sleep(0)`.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from batching.errors import Cancelled, WorkerDied
from deployments.ingress.coalesce import Coalescer
from tests.conftest import arun as run


class _Method:
    def __init__(self, calls: list, fail: BaseException | None = None) -> None:
        self.calls, self.fail = calls, fail

    def remote(self, *args):
        if self.fail is not None:
            raise self.fail
        fut = asyncio.get_running_loop().create_future()
        self.calls.append((args, fut))
        return fut


class FakeActor:
    def __init__(self) -> None:
        self.bundles: list = []
        self.cancels: list = []
        self.infer = _Method(self.bundles)
        self.cancel = _Method(self.cancels)
        self.order: list[str] = []

    def answer(self, i: int = 0, error_for: dict | None = None) -> None:
        """Answer bundle `i`: x -> x * 10, or the error given for its key."""
        (bundle, _caller, _sent), fut = self.bundles[i]
        errors = error_for or {}
        fut.set_result([(key, None, errors[key]) if key in errors
                        else (key, [x * 10 for x in items], None) for key, items, *_ in bundle])


async def spin(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def test_one_tick_is_one_bundle_and_each_request_gets_its_own_answer():
    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor, bundle_items=2)
        futs = [c.submit([x], None, None) for x in (1, 2, 3)]
        await spin()
        assert [[e[1] for e in args[0]] for args, _ in actor.bundles] == [[[1], [2]], [[3]]]
        assert all(args[1] == c.caller for args, _ in actor.bundles)
        actor.answer(1)
        actor.answer(0)
        await spin()
        assert [f.result() for f in futs] == [[10], [20], [30]]
        assert c.outstanding == 0 and c.bundles_sent == 2
    run(main())


def test_a_block_goes_with_its_count_of_requests_and_the_actor_opens_it_as_them():
    from deployments.wire.bundles import submit_entry

    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor, bundle_items=64)
        c.submit([1, 2, 3], None, None, None, 3)
        c.submit([4], None, None)
        await spin()
        (bundle, _, _), _ = actor.bundles[0]
        opened = []

        class Host:  # what a batching actor's host is handed
            def submit(self, request):
                opened.append((request.num_items, request.requests))

        for rid, entry in enumerate(bundle):
            submit_entry(Host(), "dynamic", "m", rid, entry)
        return opened

    assert run(main()) == [(3, 3), (1, 1)]


def test_a_request_cancelled_before_its_bundle_leaves_is_never_sent():
    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor)
        a, b = c.submit([1], None, None), c.submit([2], None, None)
        a.cancel()
        await spin()
        assert [[e[1] for e in args[0]] for args, _ in actor.bundles] == [[[2]]]
        assert actor.cancels == [] and c.outstanding == 1
        actor.answer()
        await spin()
        assert b.result() == [20]
    run(main())


def test_requests_cancelled_after_sending_are_cancelled_at_the_actor_in_one_call():
    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor)
        futs = [c.submit([x], None, None) for x in range(4)]
        await spin()
        keys = [e[0] for e in actor.bundles[0][0][0]]
        futs[1].cancel()
        futs[3].cancel()
        await spin()
        assert [args for args, _ in actor.cancels] == [(c.caller, [keys[1], keys[3]])]
        actor.cancels[0][1].set_result(2)
        actor.answer(error_for={keys[1]: Cancelled("x"), keys[3]: Cancelled("x")})
        await spin()
        assert [futs[0].result(), futs[2].result()] == [[0], [20]]  # the others: their own
        assert futs[1].cancelled() and futs[3].cancelled()
        assert c.outstanding == 0 and c.cancels_sent == 1
    run(main())


def test_a_failed_cancel_is_logged_and_the_other_requests_still_end(caplog):
    async def main():
        actor = FakeActor()
        c = Coalescer(lambda: actor)
        a, b = c.submit([1], None, None), c.submit([2], None, None)
        await spin()
        a.cancel()
        await spin()
        actor.cancels[0][1].set_exception(RuntimeError("actor unreachable"))
        actor.answer()
        await spin()
        assert b.result() == [20]
    with caplog.at_level(logging.WARNING, logger="deployments.ingress.coalesce"):
        run(main())
    assert "cancelling 1 requests at the batching actor failed" in caplog.text
    assert "actor unreachable" in caplog.text


def test_a_lost_actor_fails_its_bundles_requests_with_worker_died_and_is_asked_again():
    async def main():
        actors = [FakeActor(), FakeActor()]
        c = Coalescer(lambda: actors[0] if not actors[0].bundles else actors[1])
        a = c.submit([1], None, None)
        await spin()
        actors[0].bundles[0][1].set_exception(RuntimeError("ActorDiedError"))
        await spin()
        with pytest.raises(WorkerDied, match="ActorDiedError"):
            a.result()
        b = c.submit([2], None, None)
        await spin()
        assert len(actors[1].bundles) == 1  # the next bundle asked for the actor again
        actors[1].answer()
        await spin()
        assert b.result() == [20]
    run(main())


def test_an_actor_that_cannot_be_found_fails_the_bundle_at_once():
    async def main():
        def missing():
            raise ValueError("no deployment actor named batcher-x")
        c = Coalescer(missing)
        a = c.submit([1], None, None)
        await spin()
        with pytest.raises(WorkerDied, match="batcher-x"):
            a.result()
        assert c.outstanding == 0
    run(main())


def test_a_client_of_an_ingress_placed_engine_sends_through_the_handle_and_cancels_locally():
    """`RaybatchClient`'s stand-in actor (`_ViaIngress`) takes the Coalescer's calls
    (bundle and caller; cancel by caller and keys) and answers through the app's handle."""
    from deployments.ingress.client import _ViaIngress

    class Handle:
        def __init__(self) -> None:
            self.calls: list = []
            self.infer_entries = self

        def remote(self, model, bundle, sent=None):
            self.calls.append((model, bundle))
            self.answer = asyncio.get_running_loop().create_future()
            self.answer.set_result(
                [(key, [x * 10 for x in items], None) for key, items, *_ in bundle])
            self.go = asyncio.Event()

            async def answer():
                await self.go.wait()
                return await self.answer
            return answer()

    async def main():
        handle = Handle()
        via = _ViaIngress(handle, "m")
        c = Coalescer(lambda: via, bundle_items=8)
        keep, drop = c.submit([1], None, None), c.submit([2], None, None)
        await spin()
        drop.cancel()
        await spin()
        handle.go.set()
        assert await keep == [10]
        await spin()
        assert [m for m, _ in handle.calls] == ["m"] and len(handle.calls[0][1]) == 2
        assert c.cancels_sent == 1  # sent to the stand-in, which drops it: no error

    run(main())


def test_to_an_actor_that_runs_a_group_each_call_names_its_model():
    """`batcher.group`: the bundles and cancels carry the model, last; without a group
    they carry what they always did."""
    async def main():
        actor, alone = FakeActor(), FakeActor()
        c = Coalescer(lambda: actor, bundle_items=8, link=False, model="mlp")
        plain = Coalescer(lambda: alone, bundle_items=8, link=False)
        fut = c.submit([1], None, None)
        plain.submit([2], None, None)
        await spin()
        fut.cancel()
        await spin()
        return actor, alone, c

    actor, alone, c = run(main())
    (args, _), = actor.bundles
    assert len(args) == 4 and args[1] == c.caller and args[3] == "mlp"
    (cancel, _), = actor.cancels
    assert cancel == (c.caller, [0], "mlp")
    (args, _), = alone.bundles
    assert len(args) == 3
