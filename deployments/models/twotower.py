"""`TwoTower`: the demo's multi-tensor model, a tiny two-tower relevance scorer.

Two inputs and three outputs, each with its own datatype and shape, as a real
ranker or detector has: `query` FP32 [-1, 16] and `doc` FP32 [-1, 16] go through
their own tower (16 → 32 → 8, built in code from a seed, so no weights are
downloaded and every replica computes the same function); out come `score` FP32
[-1] (the sigmoid of the towers' cosine similarity × 5), `embedding` FP32 [-1, 8]
(the query's unit-length embedding) and `label` BYTES [-1] (`relevant` when the
score is above 0.5, else `irrelevant`). Each row depends only on its own query
and document, so a row that reached the wrong request cannot go unnoticed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batching.model import VectorTransformer
from deployments.models.simple import set_torch_threads

DIM, HIDDEN, EMBED = 16, 32, 8


class TwoTower(VectorTransformer):
    """{"query": FP32 [B, 16], "doc": FP32 [B, 16]} →
    {"score": FP32 [B], "embedding": FP32 [B, 8], "label": BYTES [B]}."""

    def __init__(self, seed: int = 0, threads: int | None = 1) -> None:
        self.seed = seed
        self.threads = threads
        self.towers: Any = None

    def setup(self, device: str) -> None:
        import torch

        super().setup(device)
        if self.threads:
            set_torch_threads(self.threads)
        gen = torch.Generator().manual_seed(self.seed)

        def tower() -> torch.nn.Module:
            net = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.Tanh(),
                                      torch.nn.Linear(HIDDEN, EMBED))
            with torch.no_grad():
                for p in net.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1]) ** 0.5)
            return net.eval().to(device)

        self.towers = (tower(), tower())

    def preprocess(self, batch: dict[str, np.ndarray]) -> tuple[Any, Any]:
        import torch

        def tensor(name: str) -> Any:
            x = np.require(batch[name], np.float32, ["C", "W"]).reshape(-1, DIM)
            return torch.from_numpy(x).to(self.device)

        return tensor("query"), tensor("doc")

    def transform(self, pre: tuple[Any, Any]) -> tuple[Any, Any]:
        import torch

        query, doc = pre
        with torch.inference_mode():
            q = torch.nn.functional.normalize(self.towers[0](query), dim=1)
            d = torch.nn.functional.normalize(self.towers[1](doc), dim=1)
            return q, torch.sigmoid(5.0 * (q * d).sum(dim=1))

    def postprocess(self, pre: Any, out: tuple[Any, Any]) -> dict[str, np.ndarray]:
        embedding, score = (t.cpu().numpy() for t in out)
        label = np.where(score > 0.5, b"relevant", b"irrelevant").astype(object)
        return {"score": score, "embedding": embedding, "label": label}
