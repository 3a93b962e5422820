"""How big the notebooks' experiments are: `small` in CI, `full` when a person runs them.

The notebooks are executed by the test suite on a shared 2-core machine with a
time budget, and read by people who want curves with enough points to trust.
One switch serves both: `RAYBATCH_NOTEBOOK_SCALE=small|full`; unset, it is
`small` when `CI` is set (as CI services do) and `full` otherwise. The same
cells run at both sizes; only the sizes differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, TypeVar

SCALE_ENV = "RAYBATCH_NOTEBOOK_SCALE"
Scale = Literal["small", "full"]
T = TypeVar("T")


def notebook_scale(environ: Mapping[str, str] | None = None) -> Scale:
    """`small` or `full`, from `RAYBATCH_NOTEBOOK_SCALE`, else from `CI`.

    >>> notebook_scale({"CI": "true"}), notebook_scale({}), notebook_scale({SCALE_ENV: "full"})
    ('small', 'full', 'full')
    """
    env = os.environ if environ is None else environ
    value = env.get(SCALE_ENV, "").strip().lower()
    if not value:
        return "small" if env.get("CI", "").strip().lower() not in ("", "0", "false") else "full"
    if value not in ("small", "full"):
        raise ValueError(f"{SCALE_ENV}={env[SCALE_ENV]!r} is not a scale: set it to 'small' "
                         "(quick, as CI runs it) or 'full' (the real sizes), or unset it")
    return value  # type: ignore[return-value]


def pick(scale: Scale, *, small: T, full: T) -> T:
    """`small` or `full` by `scale`: `DURATION_S = pick(SCALE, small=0.5, full=2.0)`."""
    return small if scale == "small" else full
