"""Fixtures of the placement tests: fake sysfs trees (built by `sysfs_fixtures`) in tmp_path.

Each writes its own folder of tmp_path, so one test may take several; each returns
the `FakeSysfs` writer, so a test can add to its machine (a cpuset,
a GPU, an offline CPU) before calling `discover(machine.root)`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cluster.sysfs_fixtures import (
    FakeSysfs,
    build_container,
    build_four_gpu,
    build_hybrid,
    build_no_numa,
    build_two_socket,
)


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> FakeSysfs:
    """An empty tree, to describe a machine of one's own."""
    return FakeSysfs(tmp_path / "fake_sysfs")


@pytest.fixture
def two_socket(tmp_path: Path) -> FakeSysfs:
    return build_two_socket(tmp_path / "two_socket")


@pytest.fixture
def container(tmp_path: Path) -> FakeSysfs:
    return build_container(tmp_path / "container")


@pytest.fixture
def hybrid(tmp_path: Path) -> FakeSysfs:
    return build_hybrid(tmp_path / "hybrid")


@pytest.fixture
def four_gpu(tmp_path: Path) -> FakeSysfs:
    return build_four_gpu(tmp_path / "four_gpu")


@pytest.fixture
def no_numa(tmp_path: Path) -> FakeSysfs:
    return build_no_numa(tmp_path / "no_numa")
