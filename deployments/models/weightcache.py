"""Weights a model computes at setup, kept on disk so the next start loads them.

A demo model that trains for a few seconds at setup (`TinyLM(train_steps=...)`)
would pay those seconds on every start, on the path to the app's first answer.
Training with a fixed seed and step count is deterministic for a given torch
build, so the result is a pure function of a key: the model's arguments, the
bytes of its training data and of the code that builds and trains it, the torch
version and a format version. Keyed that
way, a cached file can only be the weights this process would have computed
(never downloaded, never shared between different inputs).

Where: `$RAYBATCH_CACHE_DIR`, else `$XDG_CACHE_HOME/raybatch`, else
`~/.cache/raybatch`. A file is written to a temporary name and renamed, so
replicas starting together never read half a file; a directory that cannot be
written, or a file that cannot be read, means computing the weights as before.
`make setup` fills the cache for the demo (`python -m deployments.models.weightcache`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what a key covers changes meaning


def cache_dir() -> Path:
    explicit = os.environ.get("RAYBATCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raybatch"


def cache_key(name: str, params: dict[str, Any], data: bytes) -> str:
    """A file name for `name`'s weights computed from `params` (JSON-able) and `data`."""
    import torch

    blob = json.dumps({"format": FORMAT, "torch": torch.__version__, "params": params},
                      sort_keys=True).encode() + hashlib.sha256(data).digest()
    return f"{name}-{hashlib.sha256(blob).hexdigest()[:20]}.pt"


def cached_state(key: str, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The state dict under `key`, loaded if cached, else `compute()`d and stored.
    Returns (state, loaded)."""
    import torch

    path = cache_dir() / key
    try:
        return torch.load(path, map_location="cpu", weights_only=True), True
    except FileNotFoundError:
        pass
    except Exception as e:  # a damaged or foreign file: compute, and replace it
        log.warning("cached weights %s unreadable (%s): computing them again", path, e)
    state = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.")
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of the dir
        os.replace(tmp, path)
    except OSError as e:  # read-only home, full disk: the weights are still right here
        log.info("could not cache weights at %s (%s): computed each start", path, e)
    return state, False


def warm(config_path: str | None = None) -> list[str]:
    """Set up every model of the config (default: the demo) whose class caches weights
    (a `cache_weights(**init_kwargs)` classmethod), so the first start loads them.
    Returns the names of the models warmed."""
    from cluster.config import import_object, load_default

    warmed = []
    for m in load_default(config_path).models:
        cls = import_object(m.transformer)
        if hasattr(cls, "cache_weights"):
            cls.cache_weights(**m.init_kwargs)
            warmed.append(m.name)
    return warmed


if __name__ == "__main__":  # `make setup`
    import sys

    names = warm(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"weights cached in {cache_dir()}: {', '.join(names) or 'none needed'}")
