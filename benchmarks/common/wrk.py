"""A `wrk` driver for the HTTP points: the load generator must not decide the result.

aiohttp's client costs 180-290 us of CPU per request on these 2 cores, as much
as the servers it measures; `wrk` (C, epoll, one thread) costs a fraction of
that. One OIP infer body (binary tensors or JSON) is written to a file, a Lua
script makes every request of the run a POST of it with its headers, and
`done()` prints one JSON line (requests, duration, latency percentiles, errors)
that `parse_summary` reads. The client's own CPU comes from `wait4`'s rusage.

    r = run_wrk("http://127.0.0.1:8000/v2/models/mlp/infer", body, headers,
                connections=128, duration_s=3)
    r.throughput_rps, r.p50_ms, r.client_cpu_us_per_req
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MARK = "WRK_SUMMARY "

# The body is read from a file in Lua: it may hold any bytes (binary tensors).
_LUA = """\
wrk.method = "POST"
local f = assert(io.open({body_path}, "rb"))
wrk.body = f:read("*a")
f:close()
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests": %d, "duration_us": %d, "bytes": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p99_us": %d, "mean_us": %.1f, "max_us": %d, "status_errors": %d, '
    .. '"socket_errors": %d}}\\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.mean, latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
"""


def lua_string(value: str) -> str:
    """`value` as a Lua string literal (escaped the way Lua reads it)."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b}" for b in ch.encode())
    out.append('"')
    return "".join(out)


def lua_script(body_path: str, headers: dict[str, str]) -> str:
    lines = [f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()]
    return _LUA.format(body_path=lua_string(body_path), headers="\n".join(lines), mark=MARK)


@dataclass(frozen=True, slots=True)
class WrkResult:
    connections: int
    window_s: float
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    client_cpu_s: float
    client_cpu_us_per_req: float
    first_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_summary(stdout: str, connections: int, client_cpu_s: float) -> WrkResult:
    """The result of one wrk run, from the JSON line its `done()` printed."""
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {stdout[-800:]!r}")
    s = json.loads(line[len(MARK):])
    n, window = s["requests"], s["duration_us"] / 1e6
    errors = s["status_errors"] + s["socket_errors"]
    ok = max(n - s["status_errors"], 0)
    return WrkResult(
        connections=connections, window_s=window, requests=ok, errors=errors,
        throughput_rps=ok / window if window else 0.0,
        p50_ms=s["p50_us"] / 1e3, p90_ms=s["p90_us"] / 1e3, p99_ms=s["p99_us"] / 1e3,
        mean_ms=s["mean_us"] / 1e3, max_ms=s["max_us"] / 1e3,
        client_cpu_s=client_cpu_s,
        client_cpu_us_per_req=client_cpu_s / ok * 1e6 if ok else float("nan"),
        first_error=(f"{s['status_errors']} non-2xx, {s['socket_errors']} socket errors"
                     if errors else None))


def wrk_binary() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("wrk is not installed: `apt-get install wrk` (Debian), or use "
                           "--http-driver aiohttp")
    return path


def run_wrk(url: str, body: bytes, headers: dict[str, str], *, connections: int,
            duration_s: float, timeout_s: float = 30.0, threads: int = 1) -> WrkResult:
    """One closed-loop wrk run of `connections` keep-alive connections (`threads` threads:
    one is the least CPU on a 2-core machine; a many-core GPU machine needs more)."""
    with tempfile.TemporaryDirectory(prefix="raybatch-wrk-") as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(str(body_path), headers))
        argv = [wrk_binary(), f"-t{max(1, min(threads, connections))}", f"-c{connections}",
                f"-d{max(1, round(duration_s))}s",
                f"--timeout={int(timeout_s)}s", "-s", str(script), url]
        before = _children_cpu_s()  # wrk's own CPU: what reaping it adds to our children's
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=duration_s + timeout_s + 30)
        cpu = _children_cpu_s() - before
    return parse_summary(proc.stdout, connections, cpu)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
