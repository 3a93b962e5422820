"""The one way a benchmark writes its figures: `save_json(args.json, result)` at the end of
its `main()`, beside the table it prints (each benchmark keeps its own `--json PATH`)."""

from __future__ import annotations

import json
import os
from typing import Any


def save_json(path: str | os.PathLike[str] | None, result: Any) -> None:
    """Write `result` as indented JSON to `path` (its folder made if need be); nothing when
    no path was asked for."""
    if path:
        folder = os.path.dirname(os.fspath(path))
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2, default=str)
