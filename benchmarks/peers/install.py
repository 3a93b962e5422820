"""The peers' own venv (`.peers/venv`, gitignored), never the project's.

`python -m venv` with the Python running the benchmark, then one `pip install` of the
peers at pinned versions (torch 2.13.0 as in the project, so the seeded weights are
the same; its CPU wheel is found on this machine's disk by pip's own configuration).

Triton: nvidia-pytriton ships `tritonserver` and one Python-backend stub per Python
version. As PyTriton itself does before it starts the server, the server's tree is
copied out (`.peers/tritonserver`) with the stub of this venv's Python put in
`backends/python/`. The stub embeds libpython, so the shared library of the venv's
base Python goes on `LD_LIBRARY_PATH` (beside the wheel's own `nvidia_pytriton.libs`),
and the venv's site-packages on `PYTHONPATH` (the stub does not read pyvenv.cfg).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".peers"
PACKAGES = ("nvidia-pytriton==0.7.0", "mosec==0.9.8", "litserve==0.2.19", "torch==2.13.0",
            "numpy", "msgpack", "orjson")


@dataclass(frozen=True)
class PeerEnv:
    root: Path  # .peers

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        v = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.venv / "lib" / v / "site-packages"

    @property
    def triton_dir(self) -> Path:
        return self.root / "tritonserver"

    @property
    def tritonserver(self) -> Path:
        return self.triton_dir / "bin" / "tritonserver"

    @property
    def triton_backends(self) -> Path:
        return self.triton_dir / "backends"

    def triton_env(self) -> dict[str, str]:
        libs = [str(self.site_packages / "nvidia_pytriton.libs"), python_libdir()]
        old = os.environ.get("LD_LIBRARY_PATH")
        return {"LD_LIBRARY_PATH": ":".join(libs + ([old] if old else [])),
                "PYTHONPATH": str(self.site_packages),
                "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
                "OMP_NUM_THREADS": "1"}


def python_libdir() -> str:
    """Where the shared libpython of the Python running this (the venv's base) lies."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise RuntimeError(f"{sys.executable} has no shared libpython: Triton's Python "
                           "backend stub needs one (build Python with --enable-shared)")
    return libdir


def ensure(root: Path = DEFAULT_DIR, skip_install: bool = False) -> PeerEnv:
    """The peers' venv, installed unless `skip_install` (then it must exist)."""
    env = PeerEnv(root)
    if skip_install:
        if not env.python.exists():
            raise RuntimeError(f"--skip-install, but there is no venv at {env.venv}: run once "
                               "without it")
    else:
        root.mkdir(parents=True, exist_ok=True)
        if not env.python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(env.venv)], check=True,
                           timeout=300)
        subprocess.run([str(env.python), "-m", "pip", "install", "-q", *PACKAGES],
                       check=True, timeout=1800)
    if not env.tritonserver.exists() or not skip_install:
        prepare_triton(env)
    return env


def prepare_triton(env: PeerEnv) -> None:
    dist = env.site_packages / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"nvidia-pytriton has no Python-backend stub for Python {version} "
                           f"({stub})")
    if env.triton_dir.exists():
        shutil.rmtree(env.triton_dir)
    shutil.copytree(dist, env.triton_dir,
                    ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"))
    shutil.copy(stub, env.triton_backends / "python" / "triton_python_backend_stub")


def versions(env: PeerEnv) -> dict[str, str]:
    """Installed versions of the peers, as their venv reports them."""
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('nvidia-pytriton', 'mosec', 'litserve', 'torch', 'numpy', 'msgpack', 'orjson')}))")
    out = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True,
                         timeout=60)
    import json

    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-300:]}
