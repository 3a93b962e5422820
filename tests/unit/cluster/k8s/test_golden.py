"""The manifests checked in under k8s/ are what the renderer makes of their configs now."""

from __future__ import annotations

import difflib

import pytest

from cluster.config import load_config
from cluster.k8s.manifests import header, render, to_yaml
from tests.conftest import ROOT

GOLDEN = {"k8s/demo": "deployments/configs/demo.yaml", "k8s/gpu": "deployments/configs/gpu.yaml"}


@pytest.mark.parametrize(("folder", "config"), GOLDEN.items())
def test_checked_in_manifests_match_a_fresh_render(folder, config):
    fix = (f"re-render with `make k8s` (or `raybatch render k8s --config {config} -o {folder}`)"
           f" and commit the result")
    files = render(load_config(ROOT / config))
    on_disk = {p.name for p in (ROOT / folder).glob("*.yaml")}
    assert on_disk == set(files), f"{folder} holds {sorted(on_disk)}, the renderer makes " \
                                  f"{sorted(files)}: {fix}"
    for name, objects in files.items():
        want = to_yaml(objects, header(config))
        have = (ROOT / folder / name).read_text()
        if have != want:
            diff = "".join(list(difflib.unified_diff(
                have.splitlines(True), want.splitlines(True), f"{folder}/{name} (checked in)",
                f"{folder}/{name} (rendered now)"))[:40])
            pytest.fail(f"{folder}/{name} drifted from its config: {fix}.\n{diff}")
