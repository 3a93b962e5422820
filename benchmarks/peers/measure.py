"""How one system is measured: server CPU from /proc, a wrk run, and the answer check.

CPU per request is the user+system time of the server's processes over the timed
window divided by the requests it answered. "The server's processes" are every live
process in the session the benchmark started it in (each server is started with
`start_new_session`) and every descendant of its root, so Ray's workers, Triton's
Python stub, mosec's Rust front and its workers, and LitServe's API and inference
processes are all counted, and the load generator (a child of this process) is not.

Load comes from `wrk` (one thread, keep-alive connections, `--latency`) posting one
body over and over; the Lua script and its JSON summary are `benchmarks.common.wrk`'s. The
printed "Latency Distribution" block is parsed as well, as a cross-check of the
summary's percentiles from the same histogram.

An answer is checked by posting the same body once and comparing the decoded output
with the model's own (`numpy.allclose`): a failed check raises `WrongAnswer`.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from benchmarks.common.wrk import lua_script, parse_summary, wrk_binary

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WrongAnswer(Exception):
    """A system answered with an error, or with numbers other than the model's."""


# -- CPU from /proc --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Proc:
    ppid: int
    sid: int
    cpu_s: float  # utime + stime


def parse_stat(text: str, clk_tck: int = CLK_TCK) -> Proc:
    """One /proc/<pid>/stat line. The command name (field 2) may hold spaces and
    parentheses, so fields are counted from after its last ')'."""
    fields = text[text.rfind(")") + 2:].split()
    # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime ...
    return Proc(ppid=int(fields[1]), sid=int(fields[3]),
                cpu_s=(int(fields[11]) + int(fields[12])) / clk_tck)


def proc_table() -> dict[int, Proc]:
    """pid -> `Proc` of every live process."""
    out: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                out[int(entry)] = parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return out


def server_pids(procs: Mapping[int, Proc], root: int, sid: int | None = None) -> set[int]:
    """`root`, every process in its session (`sid`, else root's), and every descendant of
    any of them: also the root's children left behind when it has exited."""
    if sid is None:
        sid = procs[root].sid if root in procs else None
    members = {pid for pid, p in procs.items() if pid == root or (sid and p.sid == sid)}
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p.ppid, []).append(pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    return members


def server_cpu_s(procs: Mapping[int, Proc], root: int) -> float:
    return sum(procs[pid].cpu_s for pid in server_pids(procs, root))


def cpu_us_per_request(before: Mapping[int, Proc], after: Mapping[int, Proc], root: int,
                       requests: int) -> float | None:
    """Server CPU (µs) per answered request over a window between two /proc samples.
    A process alive at both edges counts its growth; one born inside the window counts
    all its time; one that ended inside it is lost (none do in a steady server)."""
    if requests <= 0:
        return None
    pids = server_pids(after, root)
    spent = 0.0
    for pid in pids:
        base = before[pid].cpu_s if pid in before and before[pid].sid == after[pid].sid else 0.0
        spent += max(after[pid].cpu_s - base, 0.0)
    return spent / requests * 1e6


# -- wrk --------------------------------------------------------------------------------------
_LAT_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s+(\d+(?:\.\d+)?)(us|ms|s)\s*$")
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_latency_distribution(text: str) -> dict[float, float]:
    """percentile -> milliseconds from wrk's `--latency` "Latency Distribution" block."""
    out: dict[float, float] = {}
    inside = False
    for line in text.splitlines():
        if "Latency Distribution" in line:
            inside = True
            continue
        if inside:
            m = _LAT_LINE.match(line)
            if not m:
                break
            out[float(m.group(1))] = float(m.group(2)) * _UNIT_MS[m.group(3)]
    return out


@dataclass(frozen=True, slots=True)
class Window:
    """What one timed wrk run gave, with what the server spent over it."""

    connections: int
    requests: int
    errors: int
    first_error: str | None
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    latency_text: dict[float, float]
    server_cpu_us_per_req: float | None
    mean_batch: float | None
    loadavg: tuple[float, float, float]


def run_wrk(url: str, body: bytes, headers: Mapping[str, str], connections: int,
            duration_s: float, timeout_s: float = 10.0) -> tuple[Any, dict[float, float]]:
    """One closed-loop run: `benchmarks.common.wrk`'s summary and the --latency percentiles."""
    with tempfile.TemporaryDirectory(prefix="raybatch-peers-") as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(str(body_path), dict(headers)))
        argv = [wrk_binary(), "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s",
                f"--timeout={int(timeout_s)}s", "--latency", "-s", str(script), url]
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=duration_s + timeout_s + 30)
    return parse_summary(proc.stdout, connections, 0.0), parse_latency_distribution(proc.stdout)


def timed_window(url: str, body: bytes, headers: Mapping[str, str], connections: int,
                 duration_s: float, root: int,
                 stats: Callable[[], tuple[int, int] | None]) -> Window:
    """One measured wrk run, bracketed by /proc samples and the server's batch counts."""
    load = os.getloadavg()
    s0, p0 = stats(), proc_table()
    r, dist = run_wrk(url, body, headers, connections, duration_s)
    p1, s1 = proc_table(), stats()
    return Window(connections=connections, requests=r.requests, errors=r.errors,
                  first_error=r.first_error, throughput_rps=r.throughput_rps,
                  p50_ms=r.p50_ms, p99_ms=r.p99_ms, latency_text=dist,
                  server_cpu_us_per_req=cpu_us_per_request(p0, p1, root, r.requests),
                  mean_batch=mean_batch(s0, s1), loadavg=load)


def mean_batch(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Items per batch between two (batches, items) counts, if both were read."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


# -- answers ----------------------------------------------------------------------------------
def post(url: str, body: bytes, headers: Mapping[str, str],
         timeout_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request("POST", u.path, body=body, headers=dict(headers))
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def check_answer(url: str, body: bytes, headers: Mapping[str, str],
                 decode: Callable[[dict[str, str], bytes], np.ndarray],
                 expected: np.ndarray) -> None:
    """Post `body` once; raise `WrongAnswer` unless the decoded answer matches `expected`."""
    try:
        status, rheaders, data = post(url, body, headers)
    except OSError as e:
        raise WrongAnswer(f"no answer from {url}: {e}") from e
    if status != 200:
        raise WrongAnswer(f"HTTP {status} from {url}: {data[:200]!r}")
    try:
        got = np.asarray(decode(rheaders, data), dtype=np.float32).reshape(expected.shape)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise WrongAnswer(f"undecodable answer from {url}: {e}: {data[:200]!r}") from e
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        worst = float(np.max(np.abs(got - expected)))
        raise WrongAnswer(f"answer from {url} differs from the model's (max |diff| {worst:.3g})")
