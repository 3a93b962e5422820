"""The mlp demo model (256 -> 1024 -> 256) rebuilt for the peers, in their own venv.

The peers' venv holds no Raybatch code, so the weights are made here exactly as
`deployments.models.MLP.setup` makes them (a `torch.Generator` seeded 0, one
`randn` per parameter in `Sequential` order, scaled by 1/sqrt(fan-in)), on one
torch thread. The benchmark checks every peer's answer against Raybatch's own
`MLP` with `numpy.allclose`, so a drift here shows up as a wrong answer, not a
number. Each batch is counted and the counts written to `PEER_STATS` (a JSON
file, at most every 0.2 s) so the benchmark can report mean batch sizes.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

DIM = 256


class PeerMLP:
    def __init__(self, seed: int = 0) -> None:
        torch.set_num_threads(1)
        gen = torch.Generator().manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(DIM, 1024), torch.nn.ReLU(),
                                  torch.nn.Linear(1024, DIM))
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1]) ** 0.5)
        self.net = net.eval()
        self.batches = 0
        self.items = 0
        self._stats_path = os.environ.get("PEER_STATS")
        self._written = 0.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[n, 256] float32 -> [n, 256] float32, counted as one batch of n."""
        with torch.inference_mode():
            y = self.net(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        self.batches += 1
        self.items += len(x)
        now = time.monotonic()
        if self._stats_path and now - self._written > 0.2:
            self._written = now
            self.write_stats()
        return y.numpy()

    def write_stats(self) -> None:
        if not self._stats_path:
            return
        tmp = f"{self._stats_path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"batches": self.batches, "items": self.items}, f)
        os.replace(tmp, self._stats_path)
