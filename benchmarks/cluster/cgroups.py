"""The cgroups of the lab's hosts: each host's CPU quota, its processes, and killing them.

What it decides: a host's CPU is a cgroup's quota (`cpu.max` on cgroup v2; cgroup v1's CFS
quota where the cpu controller is bound to v1, as on a hybrid machine), with the heaviest
weight, so that a host gets its quota whatever else runs here, and no more; the head's
cgroup has no quota, the weight of a few busy tasks while Ray starts there and of one
session after (`create`, `weigh`). Membership and
killing go through the cgroup2 hierarchy where there is one (`cgroup.kill` also takes the
processes forked meanwhile); else each process gets SIGKILL.

The invariant: kill() returns only when the cgroup has no process left, and remove() only
when its directories are gone; past the timeout they raise LabError rather than leave one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cluster.names import PREFIX, LabError

PERIOD_US = 100_000
# The head's weight, in busy tasks of the machine (`Cgroups.create`): while its Ray starts
# (Ray gives a raylet a fixed 30 s to register with the GCS), then while it serves.
HEAD_STARTING_TASKS = 8
HEAD_TASKS = 1


@dataclass(frozen=True, slots=True)
class Cgroups:
    """The cgroups of hosts: `track` (a cgroup2 hierarchy: membership, `cgroup.kill`,
    `cpu.stat`) and `quota` (where the cpu controller is: the same one, or cgroup v1's)."""

    track: Path | None
    quota: Path
    v1: bool

    @classmethod
    def find(cls) -> Cgroups | str:
        """This machine's cgroups, or why there are none that can hold a CPU quota."""
        v2 = v1_cpu = None
        with open("/proc/self/mounts") as f:
            for line in f:
                _, where, kind, opts, *_ = line.split()
                if kind == "cgroup2" and v2 is None:
                    v2 = Path(where)
                elif kind == "cgroup" and "cpu" in opts.split(","):
                    v1_cpu = Path(where)
        if v2 and "cpu" in (v2 / "cgroup.controllers").read_text().split():
            return cls(track=v2, quota=v2, v1=False)
        if v1_cpu:
            return cls(track=v2, quota=v1_cpu, v1=True)
        return "no cgroup cpu controller is mounted (cgroup v2 with `cpu`, or v1's `cpu`)"

    def roots(self) -> list[Path]:
        return list(dict.fromkeys(r for r in (self.track, self.quota) if r))

    def dirs(self, name: str) -> list[Path]:
        """`name`'s cgroups: in the tracking hierarchy, and in v1's cpu where it has a quota."""
        return [root / name for root in self.roots() if (root / name).is_dir()]

    def create(self, name: str, cpus: float | None, tasks: int = 256) -> None:
        """A cgroup that weighs as much as `tasks` busy tasks (or sessions) of the machine
        (`weigh`), with a quota of `cpus` (None: no quota, the head's). A host has the
        heaviest weight: whatever else runs here, it gets its quota, as a machine of its own
        would. The head, with no quota, weighs as one session (`HEAD_TASKS`) but while its
        Ray starts (`HEAD_STARTING_TASKS`, `Lab.head_starting`)."""
        if not self.v1 and \
                "cpu" not in (self.quota / "cgroup.subtree_control").read_text().split():
            (self.quota / "cgroup.subtree_control").write_text("+cpu")
        for root in self.roots():
            (root / name).mkdir(exist_ok=True)
        quota_us = -1 if cpus is None else max(1000, round(cpus * PERIOD_US))
        if self.v1:
            (self.quota / name / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.quota / name / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (self.quota / name / "cpu.max").write_text(
                f"{'max' if quota_us < 0 else quota_us} {PERIOD_US}")
        self.weigh(name, tasks)

    def weigh(self, name: str, tasks: int) -> None:
        """Give `name` the CPU weight of `tasks` busy tasks of the machine: a group of
        cgroup v1's `cpu.shares` 1024 or v2's `cpu.weight` 100 weighs as one busy task in
        the root, or as one session where the kernel's autogroups are on (each session's
        processes weigh as one group)."""
        if self.v1:
            (self.quota / name / "cpu.shares").write_text(str(1024 * tasks))
        else:
            (self.quota / name / "cpu.weight").write_text(str(min(10000, 100 * tasks)))

    def procs_files(self, name: str) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs(name)]

    def pids(self, name: str) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files(name):
            with contextlib.suppress(FileNotFoundError):
                out.update(int(p) for p in f.read_text().split())
        return out

    def kill(self, name: str, reap: Callable[[], None] = lambda: None,
             timeout_s: float = 10.0) -> None:
        """Kill every process of `name` and wait until none is left (zombies are not)."""
        killer = self.track / name / "cgroup.kill" if self.track else None
        give_up = time.monotonic() + timeout_s
        while pids := self.pids(name):
            if killer is not None and killer.exists():
                killer.write_text("1")  # also the ones forked meanwhile
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            reap()
            if time.monotonic() > give_up:
                raise LabError(f"processes {sorted(pids)} of cgroup {name} outlived SIGKILL")
            time.sleep(0.02)

    def stat(self, name: str) -> dict[str, int]:
        """`name`'s cpu.stat: usage_usec (where cgroup2 is), nr_throttled (where the quota is)."""
        out: dict[str, int] = {}
        for d in reversed(self.dirs(name)):  # the tracking cgroup's usage wins
            with contextlib.suppress(FileNotFoundError):
                out.update((k, int(v)) for k, v in map(str.split, (d / "cpu.stat").open()))
        return out

    def names(self) -> list[str]:
        return sorted({p.name for r in self.roots() for p in r.glob(f"{PREFIX}*") if p.is_dir()})

    def remove(self, name: str, reap: Callable[[], None] = lambda: None,
               timeout_s: float = 10.0) -> None:
        give_up = time.monotonic() + timeout_s
        for d in self.dirs(name):
            while True:
                self.kill(name, reap)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: one joined after the kill, or is not reaped yet
                    if time.monotonic() > give_up:
                        raise
                    reap()
                    time.sleep(0.02)


def require() -> Cgroups:
    """This machine's cgroups; LabError saying why when there are none that hold a quota."""
    found = Cgroups.find()
    if isinstance(found, str):
        raise LabError(found)
    return found
