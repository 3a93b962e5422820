"""Demo models shipped with Raybatch, used by the demo, the tests and the benchmarks.

- `Square`: y = x², one float per item (the example every batching tutorial starts with).
- `MLP`: a torch MLP 256→1024→256 built in code with a fixed seed, so no weights are
  downloaded and two replicas compute the same function.
- `Sleep`: a stand-in for a model with a known cost, `a + b·items` seconds per batch;
  its ceiling is exact, which makes it the yardstick of batching overhead.
Each takes whole batches (`VectorTransformer`), so one call serves many requests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.model import VectorTransformer, as_batch

_interop_set = False


def set_torch_threads(n: int) -> None:
    """n intra-op threads and one inter-op thread (settable once per process)."""
    global _interop_set
    import torch

    torch.set_num_threads(n)
    if not _interop_set:
        _interop_set = True
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # parallel work already ran in this process
            pass


class Square(VectorTransformer):
    """INPUT0 FP32 [-1] → OUTPUT0 = INPUT0²."""

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        return xs * xs


class Sleep(VectorTransformer):
    """Costs `base_ms + per_item_ms · n` per batch of n; returns each item doubled."""

    def __init__(self, base_ms: float = 2.0, per_item_ms: float = 0.05) -> None:
        self.base_s = base_ms / 1e3
        self.per_item_s = per_item_ms / 1e3

    def preprocess(self, items: Sequence[Any]) -> Any:
        return as_batch(items)

    def transform(self, pre: Any) -> Any:
        time.sleep(self.base_s + self.per_item_s * len(pre))
        return pre * 2 if isinstance(pre, np.ndarray) else [x * 2 for x in pre]


class MLP(VectorTransformer):
    """FP32 [-1, 256] → FP32 [-1, 256]: Linear(256, 1024) → ReLU → Linear(1024, 256)."""

    def __init__(self, seed: int = 0, threads: int | None = 1) -> None:
        self.seed = seed
        self.threads = threads
        self.net: Any = None

    def setup(self, device: str) -> None:
        import torch

        super().setup(device)
        if self.threads:
            set_torch_threads(self.threads)
        gen = torch.Generator().manual_seed(self.seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        )
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1]) ** 0.5)
        self.net = net.eval().to(device)

    def preprocess(self, items: Sequence[Any]) -> Any:
        import torch

        x = np.ascontiguousarray(as_batch(items), dtype=np.float32).reshape(-1, 256)
        return torch.from_numpy(x).to(self.device)

    def transform(self, x: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self.net(x)

    def postprocess(self, pre: Any, out: Any) -> np.ndarray:
        return out.cpu().numpy()
