"""The Dockerfiles (Docker cannot build here): they install what pyproject declares.

Each file is parsed into instructions; the checks: Ray's image of the version pyproject
pins, torch at its pinned version, every package and the files the build reads copied
in, the package installed with all its runtime extras under constraints.txt, every
entry point run once installed, a non-root final user that the manifests' pods run
as, and the tag the header says to build being the manifests' default image.
"""

from __future__ import annotations

import re
import shlex

import pytest

from cluster.k8s.manifests import default_image
from cluster.k8s.pods import RAY_GID, RAY_UID
from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FILES = {"Dockerfile": False, "Dockerfile.gpu": True}  # name: for GPUs
DEVELOPMENT_EXTRAS = {"dev", "notebooks", "jupyter", "docs"}  # tests and notebooks: not in an image


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out, parts = [], []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            keyword, _, rest = " ".join(parts).partition(" ")
            out.append((keyword.upper(), rest.strip()))
            parts = []
    assert not parts, "a continuation line ends the file"
    return out


def pinned(requirement_prefix: str) -> str:
    """The version pyproject pins for a dependency (`name==X`)."""
    (dep,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith(requirement_prefix)]
    return dep.split("==")[1]


def pip_installs(steps: list[tuple[str, str]]) -> list[list[str]]:
    """The argument lists of every `pip install` in RUN instructions."""
    out = []
    for keyword, args in steps:
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                out.append(words[2:])
    return out


@pytest.mark.parametrize(("name", "gpu"), FILES.items())
def test_base_image_is_rays_of_the_pinned_version(name, gpu):
    steps = instructions((ROOT / name).read_text())
    (arg,) = [a for k, a in steps if k == "ARG" and a.startswith("RAY_IMAGE=")]
    image = arg.removeprefix("RAY_IMAGE=")
    assert re.fullmatch(rf"rayproject/ray:{re.escape(pinned('ray'))}-py3\d+-"
                        rf"{'gpu' if gpu else 'cpu'}", image), image
    assert steps[1] == ("FROM", "${RAY_IMAGE}")


@pytest.mark.parametrize(("name", "gpu"), FILES.items())
def test_installs_the_package_with_its_runtime_extras_under_the_pins(name, gpu):
    installs = pip_installs(instructions((ROOT / name).read_text()))
    torch = [args for args in installs if f"torch=={pinned('torch')}" in args]
    assert torch, f"{name} does not install torch=={pinned('torch')}"
    cpu_index = "https://download.pytorch.org/whl/cpu"
    assert (cpu_index in torch[0]) is not gpu  # CPU image: no CUDA wheels
    extras = sorted(set(PYPROJECT["project"]["optional-dependencies"]) - DEVELOPMENT_EXTRAS)
    package = [args for args in installs if any(a.startswith(".") for a in args)]
    assert package, f"{name} never installs the package itself"
    (target,) = [a for a in package[0] if a.startswith(".")]
    assert target == f".[{','.join(extras)}]", f"{name}: extras {target} != {extras}"
    assert "-e" not in package[0]  # an image installs, it does not develop
    assert package[0][package[0].index("-c") + 1] == "constraints.txt"


@pytest.mark.parametrize("name", FILES)
def test_copies_every_package_and_file_the_build_reads(name):
    steps = instructions((ROOT / name).read_text())
    copied = set()
    for keyword, args in steps:
        if keyword == "COPY":
            words = shlex.split(args)
            assert f"--chown={RAY_UID}:{RAY_GID}" in words
            copied |= {w.rstrip("/") for w in words[:-1] if not w.startswith("--")}
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"][
        "include"]}
    # setup.py: the optional C extension (deployments/protocol/_jsonfast.c) is built from it
    wanted = packages | {"pyproject.toml", "setup.py", "constraints.txt",
                         PYPROJECT["project"]["readme"]}
    assert wanted <= copied, f"{name} does not copy {sorted(wanted - copied)}"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ".venv" in ignored and ".git" in ignored
    assert "**/*.so" in ignored  # built here for this machine's Python: the image builds its own
    assert not wanted & set(ignored)


@pytest.mark.parametrize("name", FILES)
def test_every_entry_point_runs_once_installed(name):
    steps = instructions((ROOT / name).read_text())
    runs = " ".join(a for k, a in steps if k == "RUN")
    for script in PYPROJECT["project"]["scripts"]:
        assert re.search(rf"&& {script} --help", runs), f"{name} never runs `{script}`"


@pytest.mark.parametrize("name", FILES)
def test_runs_as_the_non_root_user_the_pods_run_as(name):
    users = [a for k, a in instructions((ROOT / name).read_text()) if k == "USER"]
    assert users and users[-1] == str(RAY_UID) and RAY_UID != 0


@pytest.mark.parametrize(("name", "gpu"), FILES.items())
def test_the_tag_it_says_to_build_is_the_manifests_default_image(name, gpu):
    text = (ROOT / name).read_text()
    tags = re.findall(r"docker build .*-t (\S+)", text)
    assert tags == [default_image(gpu)]
    assert default_image(gpu).startswith(f"raybatch:{PYPROJECT['project']['version']}")
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"-t {default_image(gpu)}" in page, "the docs' Kubernetes page builds another tag"


def test_the_cpu_image_caches_the_demo_weights_as_the_user_that_runs_it():
    steps = instructions((ROOT / "Dockerfile").read_text())
    warm = [i for i, (k, a) in enumerate(steps) if k == "RUN"
            and "deployments.models.weightcache" in a]
    install = [i for i, (k, a) in enumerate(steps) if k == "RUN" and "pip install" in a
               and "-c constraints.txt" in a]
    users = [(i, a) for i, (k, a) in enumerate(steps) if k == "USER"]
    assert warm and install and warm[0] > install[-1], "weights cached before the install"
    assert [a for i, a in users if i < warm[0]][-1] == str(RAY_UID)  # ~ray/.cache, not root's
