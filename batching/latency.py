"""An online model of batch latency as `a + b * cost`, learned from finished batches.

Exponentially weighted least squares: each observation decays the old ones by
`decay`, so the model follows a replica that warms up, throttles or moves.
It is "warm" after `min_samples` observations; before that, callers must not
trust it (a policy falls back on its fixed delay). Predictions are never
negative and the slope never goes below zero: a bigger batch does not get faster.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LatencyModel:
    """Exponentially weighted linear fit of latency (seconds) against batch cost.

    >>> m = LatencyModel(min_samples=2)
    >>> m.observe(1, 0.003); m.observe(9, 0.007)
    >>> round(m.predict(5), 4)
    0.005
    """

    decay: float = 0.95
    min_samples: int = 8
    _n: int = 0
    _w: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def observe(self, cost: float, latency_s: float) -> None:
        d = self.decay
        self._n += 1
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + cost
        self._sy = self._sy * d + latency_s
        self._sxx = self._sxx * d + cost * cost
        self._sxy = self._sxy * d + cost * latency_s

    @property
    def observed(self) -> bool:
        """Whether any batch was observed (a prediction from fewer than `min_samples`)."""
        return self._n > 0

    @property
    def warm(self) -> bool:
        return self._n >= self.min_samples

    @property
    def coefficients(self) -> tuple[float, float]:
        """(a, b): fixed seconds per batch and seconds per unit of cost."""
        if self._w == 0.0:
            return 0.0, 0.0
        mx, my = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mx * mx
        b = (self._sxy / self._w - mx * my) / var if var > 1e-12 * max(1.0, mx * mx) else 0.0
        b = max(b, 0.0)
        a = max(my - b * mx, 0.0)
        return a, b

    def predict(self, cost: float) -> float:
        a, b = self.coefficients
        return a + b * cost
