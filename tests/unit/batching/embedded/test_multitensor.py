"""The embedded host with named tensors and ragged items: requests split across batches
and padded together still get exactly their own rows of every output."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from batching import BatchedService, DynamicPolicy, VectorTransformer
from batching.tensors import TensorBatch


class SumAndTag(VectorTransformer):
    """{"ids": [B, L] (padded with -1), "w": [B]} -> {"n": [B], "total": [B], "L": [B]}."""

    def __init__(self, seen: list, gate: threading.Event) -> None:
        self.seen, self.gate = seen, gate

    def transform(self, batch):
        self.gate.wait(5)
        ids, w = batch["ids"], batch["w"]
        self.seen.append(len(ids))
        real = ids >= 0
        return {"n": real.sum(1), "total": np.where(real, ids, 0).sum(1) * w,
                "L": np.full(len(ids), ids.shape[1])}


def test_split_and_padded_requests_get_their_own_rows():
    from batching.tensors import Collate, Ragged

    seen: list = []
    gate = threading.Event()
    rng = np.random.default_rng(0)
    requests = [TensorBatch({"ids": rng.integers(0, 9, (n, length)),
                             "w": np.full(n, float(i))})
                for i, (n, length) in enumerate([(3, 2), (5, 7), (1, 4), (4, 1)])]

    async def main():
        policy = DynamicPolicy(max_batch_size=4, max_queue_delay_s=0.0)
        service = BatchedService(SumAndTag, policy, init_args=(seen, gate), executor="thread",
                                 collate=Collate({"ids": Ragged("pad", 1, -1)}))
        async with service as svc:
            calls = [asyncio.ensure_future(svc.submit_many(r)) for r in requests]
            await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(*calls)

    outs = asyncio.run(main())
    assert max(seen) <= 4 and sum(seen) == 13  # 13 items in batches of at most 4: split
    for r, out in zip(requests, outs, strict=True):
        assert isinstance(out, TensorBatch) and len(out) == len(r)
        assert out["n"].tolist() == [r["ids"].shape[1]] * len(r)
        np.testing.assert_array_equal(out["total"], r["ids"].sum(1) * r["w"])
        assert (out["L"] >= r["ids"].shape[1]).all()
