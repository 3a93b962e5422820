"""The Python path: a Serve DeploymentHandle, and RaybatchClient bundling many calls into few."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from batching.errors import InvalidRequest, Overloaded
from deployments.ingress.client import RaybatchClient
from deployments.ingress.deployment import UnknownModel
from tests.conftest import arun

pytestmark = pytest.mark.integration


def test_handle_infer_returns_the_outputs(app):
    x = np.array([1.5, -2.0, 3.0], np.float32)
    out = app.handle.infer.remote("square", {"INPUT0": x}).result(timeout_s=30)
    assert list(out) == ["OUTPUT0"]
    assert out["OUTPUT0"].dtype == np.float32
    np.testing.assert_array_equal(out["OUTPUT0"], x * x)


def test_handle_errors_are_raised_to_the_caller(app):
    x = np.array([1.0], np.float32)
    with pytest.raises(UnknownModel, match="Request for unknown model: 'nope' is not found"):
        app.handle.infer.remote("nope", {"INPUT0": x}).result(timeout_s=30)
    with pytest.raises(InvalidRequest, match="priority=7 is out of range"):
        app.handle.infer.remote("square", {"INPUT0": x}, {"priority": 7}).result(timeout_s=30)


def test_client_gives_500_concurrent_callers_their_own_results_in_few_calls(app):
    xs = [np.array([i, i + 0.5], np.float32) for i in range(500)]

    async def main():
        client = RaybatchClient(app.handle)
        outs = await asyncio.gather(*(client.infer("square", {"INPUT0": x}) for x in xs),
                                    return_exceptions=True)
        return client.calls, outs

    before = app.stats("square")
    calls, outs = arun(main())
    # square is admitted by time (max_queue_wait_s, 1 s, the default): on a machine other
    # work keeps busy a batch may be measured slow enough that the burst's tail is refused,
    # each refused caller told so; every other caller gets its own x²
    served = 0
    for x, out in zip(xs, outs, strict=True):
        if isinstance(out, Overloaded):
            continue
        assert isinstance(out, dict), out
        np.testing.assert_array_equal(out["OUTPUT0"], x * x)
        served += 1
    assert served >= 64, f"only {served} of 500 callers served"
    # 1,000 items in bundles of at most one batch (64 items, 32 requests): 16 calls
    assert calls <= 17, f"{calls} Ray calls for 500 requests: the client did not coalesce"
    after = app.stats("square")
    assert after["success"]["count"] - before["success"]["count"] == served
    assert after["items"] - before["items"] == 2 * served
    assert after["batches"] - before["batches"] < served  # the batcher batched them too


def test_client_hands_each_caller_its_own_error(app):
    async def main():
        client = RaybatchClient(app.handle)
        good = client.infer("square", {"INPUT0": np.array([3.0], np.float32)})
        empty = client.infer("square", {"INPUT0": np.zeros(0, np.float32)})
        wrong = client.infer("square", {"WRONG": np.array([1.0], np.float32)})
        return await asyncio.gather(good, empty, wrong, return_exceptions=True)

    good, empty, wrong = arun(main())
    np.testing.assert_array_equal(good["OUTPUT0"], [9.0])
    assert isinstance(empty, InvalidRequest) and "empty batch dimension" in str(empty)
    assert isinstance(wrong, InvalidRequest) and str(wrong).startswith(
        "unexpected inference input 'WRONG' for model 'square'")


def test_client_runs_sequences_and_generations_too(app):
    async def main():
        client = RaybatchClient(app.handle)
        sums = []
        for i, v in enumerate([4, 5, 6]):
            out = await client.infer("accumulator", {"INPUT0": np.array([[v]], np.int32)},
                                     {"sequence_id": "client-seq", "sequence_start": i == 0,
                                      "sequence_end": i == 2})
            sums.append(int(out["OUTPUT0"][0][0]))
        events = [e async for e in client.generate_stream("tinylm", "abc", {"max_tokens": 6})]
        whole = await client.generate("tinylm", "abc", {"max_tokens": 6})
        return sums, events, whole

    sums, events, whole = arun(main())
    assert sums == [4, 9, 15]
    assert events[-1]["final"] and events[-1]["num_tokens"] == whole["num_tokens"] == 6
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
