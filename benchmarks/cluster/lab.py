"""A lab of hosts on this machine: network namespaces on a bridge, each its own machine.

What it decides: a host is a network namespace with its own address (198.18.0.10+i on a
veth into the bridge `rblab-br`, whose 198.18.0.1 is the head: the root namespace, where
the test and the Ray head run), its own CPU (a cgroup's quota: cgroups.py) and
its own /tmp (a private directory bind-mounted on /tmp in a mount namespace of each
process it runs: Ray's session files and Raybatch's core allocator live there, one per
machine). 198.18.0.0/24 (in RFC 2544's benchmarking range) is the whole world of a host:
no default route, no NAT, and nothing of the machine's (ip_forward, firewall) is changed.

Why this shape: faults must look like a real network's. `partition` takes the host's
bridge port down, so nothing, not even a FIN or RST, crosses until `heal`; `kill` kills
every process of the host's cgroup (`cgroup.kill`); `power_loss` cuts the link first, so
the dying processes' FINs are lost as a dead machine's are.

The invariant: whatever happens, nothing is left. Every object is named `rblab-*`; a lab
is one per machine (its subnet is fixed), held by a lock (/tmp/rblab.lock) for its life,
so a lab that starts owns every `rblab-*` object there is and sweeps them first: a test
killed with SIGKILL leaves its lab to the next one. close(), atexit, SIGTERM and SIGINT
sweep too. Ray on the lab (start_head, join, wait_nodes) is in labray.py.

    with Lab(hosts=2, cpus=0.4) as lab:
        head = lab.start_head()
        lab.join(0, head); lab.join(1, head)
        lab.wait_nodes(head, 3)
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.cluster.cgroups import HEAD_STARTING_TASKS, HEAD_TASKS, Cgroups, require
from benchmarks.cluster.labray import HEAD_RAY_TMP, RayOnLab
from benchmarks.cluster.names import HEAD_IP, LAB_DIR, PREFIX, LabError, sh

__all__ = ["HEAD_IP", "HEAD_RAY_TMP", "Lab", "LabError", "available", "leftovers", "sweep"]

BRIDGE = f"{PREFIX}br"
LOCK = Path("/tmp/rblab.lock")  # not `rblab-`: a sweep never removes it
NETNS_DIR = Path("/run/netns")  # where `ip netns add` puts its handles
HEAD_CGROUP = f"{PREFIX}head"
TOOLS = ("ip", "tc", "nsenter", "unshare", "mount", "umount")


def _links() -> list[str]:
    out = sh("ip", "-o", "link", "show")
    names = (line.split(":")[1].strip().split("@")[0] for line in out.splitlines())
    return [n for n in names if n.startswith(PREFIX)]


def _netns() -> list[str]:
    return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(PREFIX)) \
        if NETNS_DIR.is_dir() else []


_SAFE = re.compile(r"[A-Za-z0-9._-]+\Z")


def _kept_in_tmp() -> list[str]:
    """The folders of /tmp a host must still see under its own /tmp: those holding this
    checkout or this Python (a checkout in /tmp, as CI's may be, would vanish otherwise)."""
    tmp = Path("/tmp")
    keep = set()
    for p in (Path(__file__).resolve(), Path(sys.prefix).resolve(),
              Path(sys.executable).resolve()):
        if p.is_relative_to(tmp) and len(p.parts) > 2 and _SAFE.match(p.parts[2]):
            keep.add(p.parts[2])
    return sorted(keep)


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = (line.split()[4] for line in f)
        return [p for p in points if f"/{PREFIX}" in p]


def leftovers() -> list[str]:
    """Every `rblab-*` object on this machine: none when no lab is running."""
    found = [f"netns {n}" for n in _netns()] + [f"link {n}" for n in _links()]
    cgroups = Cgroups.find()
    if not isinstance(cgroups, str):
        found += [f"cgroup {d}" for n in cgroups.names() for d in cgroups.dirs(n)]
    found += [f"mount {m}" for m in _mounts()]
    return found + [f"dir {p}" for p in sorted(Path("/tmp").glob(f"{PREFIX}*"))]


def sweep(reap: Callable[[], None] = lambda: None) -> None:
    """Remove every `rblab-*` object: processes (killed), netns, links, mounts, dirs.
    Only for the lock's holder (a starting lab) or a machine with no lab running; `reap`
    waits for the caller's own children that were killed."""
    cgroups = Cgroups.find()
    if not isinstance(cgroups, str):
        for name in cgroups.names():
            cgroups.remove(name, reap)
    for ns in _netns():
        sh("ip", "netns", "del", ns, check=False)  # its veth end goes, and the pair
    for link in _links():
        sh("ip", "link", "del", link, check=False)
    for point in reversed(_mounts()):
        sh("umount", "-l", point, check=False)
    for path in Path("/tmp").glob(f"{PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


_AVAILABLE: list[str | None] = []  # the probe's answer, once per process


def available() -> str | None:
    """None when a lab can be made here; else why not and what would make it work."""
    if not _AVAILABLE:
        _AVAILABLE.append(_probe())
    return _AVAILABLE[0]


def _probe() -> str | None:
    need = ("the lab needs Linux, root, iproute2 (ip, tc), util-linux (nsenter, unshare, "
            "mount) and a cgroup cpu controller (cgroup v2 at /sys/fs/cgroup, or v1's cpu)")
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return f"{need}: not root on Linux here"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{need}: {', '.join(missing)} missing (apt-get install iproute2 util-linux)"
    cgroups = Cgroups.find()
    if isinstance(cgroups, str):
        return f"{need}: {cgroups}"
    probe = f"{PREFIX}probe"
    try:
        sh("ip", "netns", "add", probe)
        sh("ip", "link", "add", probe, "type", "bridge")
        cgroups.create(probe, 0.1)
        sh("unshare", "--mount", "--propagation", "private", "true")
    except (LabError, OSError) as e:
        return f"{need}: {e}"
    finally:
        sh("ip", "netns", "del", probe, check=False)
        sh("ip", "link", "del", probe, check=False)
        with contextlib.suppress(OSError, LabError):
            cgroups.remove(probe)
    return None


class Lab(RayOnLab):
    """`hosts` hosts at 198.18.0.10+i, each with `cpus` of CPU and, if given,
    `bandwidth_mbit` each way; the head (this namespace) is 198.18.0.1."""

    available = staticmethod(available)
    leftovers = staticmethod(leftovers)
    sweep = staticmethod(sweep)

    def __init__(self, hosts: int = 2, cpus: float = 0.4, bandwidth_mbit: float | None = None,
                 lock_timeout_s: float = 120.0) -> None:
        if not 1 <= hosts <= 240:
            raise ValueError(f"hosts={hosts} must be between 1 and 240")
        if cpus <= 0 or (bandwidth_mbit is not None and bandwidth_mbit <= 0):
            raise ValueError(f"cpus={cpus} and bandwidth_mbit={bandwidth_mbit} must be > 0")
        self.hosts, self.cpus, self.bandwidth_mbit = hosts, cpus, bandwidth_mbit
        self.lock_timeout_s = lock_timeout_s
        self._lock: Any = None
        self._procs: list[subprocess.Popen] = []
        self._cgroups: Cgroups | None = None

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Lab:
        """Take the machine's lab lock, sweep what a killed lab left, and build the lab."""
        why = available()
        if why:
            raise LabError(why)
        if _LIVE:  # its lock would wait for a lab that this very process holds
            raise LabError("a lab runs in this process already: one lab per machine")
        self._take_lock()
        _watch(self)
        try:
            sweep()
            self._cgroups = require()
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every process of the lab and remove everything it made. Idempotent."""
        lock, self._lock = self._lock, None  # a close that a signal interrupts is not redone
        if lock is None:
            return
        try:
            sweep(self._reap)
        finally:
            self._reap()
            _unwatch(self)
            lock.close()  # releases the flock

    def address(self, host: int) -> str:
        self._host(host)
        return f"198.18.0.{10 + host}"

    def tmp_dir(self, host: int) -> Path:
        """The host's /tmp as this (the head's) namespace sees it."""
        return Path(f"/tmp/{self._host(host)}")

    def run(self, host: int | None, argv: Sequence[str], env: Mapping[str, str] | None = None,
            log: str | os.PathLike[str] | None = None, **popen: Any) -> subprocess.Popen:
        """Run `argv` on `host` (its netns, cgroup and /tmp), or on the head with None (the
        root namespace, in a cgroup of its own so that close() finds it, weighing as one
        session of the machine but while its Ray starts: `head_starting`); output to `log`."""
        name = HEAD_CGROUP if host is None else self._host(host)
        joins = "".join(f"echo $$ > {shlex.quote(str(f))} && "
                        for f in self._cg().procs_files(name))
        if host is not None:  # the bind mount is in this process's own mount namespace
            keep = "".join(f'mkdir -p "$0/{d}" && mount --bind /tmp/{d} "$0/{d}" && '
                           for d in _kept_in_tmp())
            argv = ["nsenter", f"--net={NETNS_DIR / name}", "--", "unshare", "--mount",
                    "--propagation", "private", "--", "sh", "-c",
                    keep + 'mount --rbind "$0" /tmp && exec "$@"', str(self.tmp_dir(host)),
                    *argv]
        out = open(log, "ab") if log is not None else None  # noqa: SIM115 (Popen dups it)
        try:
            if out is not None:
                popen.setdefault("stdout", out)
                popen.setdefault("stderr", subprocess.STDOUT)
            proc = subprocess.Popen(["sh", "-c", joins + "exec " + shlex.join(argv)],
                                    env=None if env is None else dict(env),
                                    stdin=subprocess.DEVNULL, start_new_session=True, **popen)
        finally:
            if out is not None:
                out.close()
        self._procs.append(proc)
        self._joined(proc, name)
        return proc

    def _joined(self, proc: subprocess.Popen, name: str) -> None:
        """Return once `proc` is in each of its cgroups (or has ended): a close() that came
        between its fork and its joining would miss it, and wait on it."""
        files = self._cg().procs_files(name)
        give_up = time.monotonic() + 10.0
        while proc.poll() is None and time.monotonic() < give_up:
            with contextlib.suppress(FileNotFoundError):
                if all(str(proc.pid) in f.read_text().split() for f in files):
                    return
            time.sleep(0.002)

    def pids(self, host: int | None) -> set[int]:
        return self._cg().pids(HEAD_CGROUP if host is None else self._host(host))

    def cpu_stat(self, host: int) -> dict[str, int]:
        """The host's cgroup cpu.stat: `usage_usec` (CPU time of its processes),
        `nr_throttled` (periods its quota held it back), ..."""
        return self._cg().stat(self._host(host))

    def kill(self, host: int | None) -> None:
        """Kill every process of `host` (None: the head's) and wait until none is left."""
        self._cg().kill(HEAD_CGROUP if host is None else self._host(host), reap=self._reap)

    def partition(self, host: int) -> None:
        """Cut the host's link: packets either way are dropped, nothing is sent instead."""
        sh("ip", "link", "set", self._host(host), "down")

    def heal(self, host: int) -> None:
        sh("ip", "link", "set", self._host(host), "up")

    def power_loss(self, host: int) -> None:
        """The link goes first, then every process: its closing packets reach no one. The
        link stays down until heal() (the host's kernel may then still send those)."""
        self.partition(host)
        self.kill(host)

    # -- inside ------------------------------------------------------------------------

    def _host(self, host: int) -> str:
        if not 0 <= host < self.hosts:
            raise IndexError(f"host {host} is not in this lab of {self.hosts}")
        return f"{PREFIX}h{host}"

    @contextlib.contextmanager
    def head_starting(self) -> Iterator[None]:
        """The head's cgroup weighs as a few busy tasks of the machine (HEAD_STARTING_TASKS)
        within, as one session after. Ray gives a raylet a fixed 30 s to register with its
        GCS: at the weight of one, beside a busy machine (24 busy sessions; a CI box with a
        CPU hog and a lane of Ray workers, load average 25 on 2 cores) the GCS answered too
        late and `ray start` gave up three times in a row. Kept while the head serves, that
        weight took most of a core from the rest of the machine (the other test lane's
        metrics agent missed every Prometheus scrape)."""
        self._cg().weigh(HEAD_CGROUP, HEAD_STARTING_TASKS)
        try:
            yield
        finally:
            self._cg().weigh(HEAD_CGROUP, HEAD_TASKS)

    def _cg(self) -> Cgroups:
        if self._cgroups is None or self._lock is None:
            raise LabError("the lab is not started: use `with Lab(...)` or start()")
        return self._cgroups

    def _take_lock(self) -> None:
        lock = open(LOCK, "a+")  # noqa: SIM115 (held for the lab's life)
        give_up = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    lock.seek(0)
                    holder = lock.read().strip()
                    lock.close()
                    raise LabError(f"another lab (pid {holder}) holds {LOCK} for "
                                   f"{self.lock_timeout_s} s: one lab per machine") from None
                time.sleep(0.1)
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _build(self) -> None:
        cg = self._cg()
        LAB_DIR.mkdir()
        cg.create(HEAD_CGROUP, None, tasks=HEAD_TASKS)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        _no_ipv6(BRIDGE)
        sh("ip", "addr", "add", f"{HEAD_IP}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i in range(self.hosts):
            name = self._host(i)
            sh("ip", "netns", "add", name)
            sh("ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p",
                "netns", name)
            _no_ipv6(name)
            sh("ip", "link", "set", name, "master", BRIDGE, "up")
            sh("ip", "netns", "exec", name, "sh", "-c", _NO_IPV6)
            sh("ip", "-n", name, "link", "set", f"{name}p", "name", "eth0")
            sh("ip", "-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            sh("ip", "-n", name, "link", "set", "eth0", "up")
            sh("ip", "-n", name, "link", "set", "lo", "up")
            if self.bandwidth_mbit:
                for netns, dev in ((None, name), (name, "eth0")):
                    sh("tc", *(["-n", netns] if netns else []), "qdisc", "add", "dev", dev,
                        "root", *_tbf(self.bandwidth_mbit))
            cg.create(name, self.cpus)
            self.tmp_dir(i).mkdir(mode=0o1777)
            os.chmod(self.tmp_dir(i), 0o1777)  # as /tmp: mkdir's mode is masked

    def _reap(self) -> None:
        for proc in self._procs:
            proc.poll()
        self._procs = [p for p in self._procs if p.returncode is None]


def _no_ipv6(link: str) -> None:
    """No link-local IPv6 on the lab's links: 198.18.0.0/24 is their only network."""
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")


_NO_IPV6 = ("for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 "
            "/proc/sys/net/ipv6/conf/default/disable_ipv6; do [ ! -e $f ] || echo 1 > $f; done")


def _tbf(mbit: float) -> list[str]:
    """A token bucket of `mbit`, a burst of 10 ms of it (at least 16 KiB), 50 ms of queue."""
    burst = max(16 * 1024, int(mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms"]



# Live labs of this process, closed at exit and on SIGTERM / SIGINT (then the signal's own
# handling goes on: KeyboardInterrupt, or death by SIGTERM).
_LIVE: list[Lab] = []
_PREVIOUS: dict[int, Any] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _close_all() -> None:
    for lab in list(_LIVE):
        lab.close()


def _on_signal(signum: int, frame: Any) -> None:
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    _close_all()  # restores the previous handlers, the last lab gone
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def _watch(lab: Lab) -> None:
    if not _LIVE and threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            _PREVIOUS[s] = signal.signal(s, _on_signal)
    _LIVE.append(lab)


def _unwatch(lab: Lab) -> None:
    with contextlib.suppress(ValueError):
        _LIVE.remove(lab)
    if not _LIVE and threading.current_thread() is threading.main_thread():
        for s, previous in list(_PREVIOUS.items()):
            if signal.getsignal(s) is _on_signal:
                signal.signal(s, previous)
            del _PREVIOUS[s]


atexit.register(_close_all)
