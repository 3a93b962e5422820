"""What setup compiles to bytecode (raybatch.bytecode): the running product's imports, which a
Ray worker parses at every start where PYTHONDONTWRITEBYTECODE is set, and not the extras."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from raybatch import bytecode


def test_the_runtime_is_raybatch_s_requirements_with_the_extras_they_name_and_not_its_own():
    names = set(bytecode.runtime_distributions())
    # its own requirements, theirs (torch's, pydantic's) and ray's serve extra
    assert {"raybatch", "ray", "torch", "numpy", "pydantic", "pydantic-core",
            "fastapi", "starlette", "uvicorn", "grpcio"} <= names
    # raybatch's extras (dev, notebooks, embeddings, docs) are not the runtime's
    assert not {"pytest", "hypothesis", "openai", "transformers", "sentence-transformers",
                "matplotlib", "mkdocs", "nbmake"} & names


def test_its_files_are_the_runtime_s_modules_and_the_project_s_packages():
    files = bytecode.runtime_files()
    root = bytecode.ROOT
    assert root / "deployments" / "batcher" / "actor.py" in files
    assert root / "batching" / "dynamic" / "batcher.py" in files
    assert any(p.parts[-2:] == ("ray", "actor.py") for p in files)
    assert any(p.parts[-2:] == ("torch", "__init__.py") for p in files)
    assert not any("site-packages" in p.parts and p.parts[p.parts.index("site-packages") + 1]
                   in ("pytest", "_pytest", "openai", "transformers") for p in files)
    assert all(p.suffix == ".py" and p.is_file() for p in files)


def test_compile_writes_a_cache_and_skips_what_does_not_compile(tmp_path: Path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("def (:\n")
    assert bytecode._compile([good, bad]) == 1
    assert Path(importlib.util.cache_from_source(str(good))).is_file()
