"""Fixtures of the integration and e2e tests: one local Ray and one deployed app per session.

Ray is imported inside the fixtures only, so collecting or running the unit
tests never loads it. The shared app (`tests/configs/app.yaml`) is deployed
once; tests that need an app of their own deploy it beside the shared one under
another name and route prefix, and delete it again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "configs"
APP_CONFIG = CONFIGS / "app.yaml"

# Every Ray the tests start (the session's, each `raybatch up`, the labs' hosts, the
# notebooks') inherits these:
# - Ray's log monitor lists its node's log directory for new files every 5 s instead of
#   10 times a second (under 1,000 files it lists them on every pass of its 0.1 s loop; a
#   session's directory holds a few hundred), still tailing the files it has every 0.1 s.
#   Where logs reach a driver, a new worker's first lines may come up to 5 s later; no
#   test reads them sooner.
# - Ray's workers (every actor: replicas, batching actors, Serve's) run at the tests'
#   own priority, not Ray's default nice 15: on a machine where other work takes a core,
#   a nice-15 worker gets a few percent of it beside a nice-0 process, and the tests
#   that wait on workers wait for a core.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_configure(config: pytest.Config) -> None:
    # Ray Serve's own pydantic models use deprecated Field arguments: not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:ray\\..*")
    so = os.environ.get("RAYBATCH_FRONT_SO")
    if so:  # the native front as tests/sanitize.sh built it, in place of the installed one
        import importlib.util
        import sys
        spec = importlib.util.spec_from_file_location("deployments.http.native._front", so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["deployments.http.native._front"] = module


# How long a test may wait on something before it counts as hung: a guard against a hang,
# never a bound on speed (a busy 2-core machine runs a test several times slower than a quiet
# one; a test fails for being slow only short of this).
HANG_S = 120.0


def wait_until(check: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.1,
               what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
    give_up = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > give_up:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what} (last: {value!r})")
        time.sleep(every_s)


@dataclass
class App:
    """The shared app: where it listens and how to reach it."""

    name: str
    base_url: str  # http://127.0.0.1:PORT, no trailing slash: Serve's proxy
    port: int
    handle: Any  # the ingress DeploymentHandle
    config: Any  # the RaybatchConfig it was built from
    gate: Path  # while this file exists, the `gated` model holds its batch
    gcs_address: str
    direct_url: str  # the ingress replica's own port: the HTTP fast path (no proxy)
    grpc_port: int = 0  # Serve's gRPC proxy with the KServe v2 / Triton service

    @property
    def direct_grpc_port(self) -> int:
        """The ingress replica's own gRPC port (Serve's direct ingress, no proxy)."""
        return direct_port(self.name, "GRPC")

    @property
    def native_url(self) -> str:
        """Raybatch's own HTTP server in the ingress replicas (`ingress.native_port`)."""
        return f"http://127.0.0.1:{self.config.ingress.native_port}"

    def stats(self, model: str) -> dict[str, Any]:
        """The batching actor's statistics of `model` (through the ingress)."""
        return self.handle.status.remote().result(timeout_s=30)[model]

    async def astats(self, model: str) -> dict[str, Any]:
        return (await self.handle.status.remote())[model]


# Where the session's Ray exports its metrics (Prometheus text), and how often workers
# report to it (Ray's default is every 10 s; tests that read metrics would wait that long).
METRICS_PORT = free_port()
METRICS_REPORT_INTERVAL_MS = 2000


@pytest.fixture(scope="session")
def ray_address():
    """A local Ray for the whole session; yields its GCS address."""
    import ray

    from cluster.localray import start_local
    from deployments.http import FAST_PATH_ENV

    # Serve's direct ingress with Raybatch's HTTP fast path, as `raybatch up` can run it:
    # set before Ray starts, so the controller, the proxy and every replica see it. No
    # draining period at shutdown (tests delete apps often; no load balancer to wait for).
    os.environ.update(FAST_PATH_ENV)
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "0")
    # Workers put the driver's working directory on sys.path: make it the repository,
    # so replicas can import `tests.models` wherever pytest was started from.
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        # Logical CPUs for reservations (the shared app holds ~3.1; other tests deploy apps
        # beside it): fractional num_cpus, not the machine's cores.
        # as `raybatch up` starts one: again if a busy machine made it miss Ray's fixed waits
        start_local(ray.init, say=lambda what: print(f"\nnote: {what}", flush=True),
                    address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
                    _metrics_export_port=METRICS_PORT,
                    _system_config={"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS})
    finally:
        os.chdir(cwd)
    _session_logs.append(Path(ray._private.worker._global_node.get_logs_dir_path()))
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


# The session Ray's log folder: at the end of a run that failed, what Ray itself did (its
# memory monitor killing workers, Serve's controller restarting) is printed from it, since
# none of it reaches a test's output (`tests.ray_evidence`).
_session_logs: list[Path] = []


def pytest_terminal_summary(terminalreporter, exitstatus) -> None:
    if exitstatus != 0 and _session_logs:
        from tests.ray_evidence import summary

        for line in summary(_session_logs[0]):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def metrics_url(ray_address) -> str:
    """The session Ray's metrics endpoint (what Prometheus scrapes)."""
    return f"http://127.0.0.1:{METRICS_PORT}/metrics"


def load_test_config(gate: Path) -> Any:
    import yaml

    from cluster.config import load_config

    data = yaml.safe_load(APP_CONFIG.read_text())
    data["ingress"]["native_port"] = free_port()  # Raybatch's own HTTP server
    for m in data["models"]:
        if m["name"] in ("gated", "scaling", "held"):
            m["init_kwargs"]["gate_path"] = str(gate)
    return load_config(data)


@pytest.fixture(scope="session")
def app(ray_address, tmp_path_factory) -> App:
    """The shared app, deployed once on 127.0.0.1 at a free port."""
    from ray import serve

    from deployments.app import build_app
    from raybatch.serving import grpc_options

    port, grpc_port = free_port(), free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                grpc_options=grpc_options(grpc_port))
    gate = tmp_path_factory.mktemp("gate") / "closed"
    config = load_test_config(gate)
    handle = serve.run(build_app(config), name=config.app_name,
                       route_prefix=config.ingress.route_prefix)
    yield App(config.app_name, f"http://127.0.0.1:{port}", port, handle, config, gate,
              ray_address, direct_url(config.app_name), grpc_port)
    serve.shutdown()


def direct_url(app_name: str) -> str:
    """The base URL of `app_name`'s (first) ingress replica's own HTTP server."""
    return f"http://127.0.0.1:{direct_port(app_name, 'HTTP')}"


def direct_port(app_name: str, protocol: str) -> int:
    """The port of `app_name`'s (first) ingress replica's own server of `protocol`
    (HTTP or GRPC: Serve's direct ingress)."""
    import ray
    from ray.serve._private.common import RequestProtocol
    from ray.serve.context import _get_global_client

    controller = _get_global_client()._controller
    groups = ray.get(controller.get_target_groups.remote(app_name))
    ports = [t.port for g in groups if g.protocol == RequestProtocol[protocol] for t in g.targets]
    assert ports, f"no direct-ingress {protocol} port for {app_name}: {groups}"
    return ports[0]


FRONTS = ["proxy", "fast-path", "native"]


@pytest.fixture(scope="module", params=FRONTS)
def front_url(app: App, request) -> str:
    """The shared app's base URL through each HTTP front: Serve's proxy (the app under
    Serve's per-request wrapper), the replica's own port under uvicorn (the fast path),
    and Raybatch's own HTTP server (`ingress.native_port`)."""
    return {"proxy": app.base_url, "fast-path": app.direct_url,
            "native": app.native_url}[request.param]


@pytest.fixture
def gate(app: App):
    """Closes the `gated` model's gate for one test; opens it and waits for the model to idle."""

    class Gate:
        def close(self) -> None:
            app.gate.touch()

        def open(self) -> None:
            app.gate.unlink(missing_ok=True)

    g = Gate()
    yield g
    g.open()
    wait_until(lambda: (lambda s: s["open_requests"] == 0 and s["inflight_batches"] == 0)(
        app.stats("gated")), timeout_s=30, what="the gated model to finish")


def alive_pids(prefix: str, suffix: str = "") -> list[int]:
    """Pids of the live actors named `prefix...suffix`, from the GCS (the tests share the
    node with the cluster, so they can signal them or read their memory)."""
    from ray._private.state import actors

    return [a["Pid"] for a in actors().values() if a["State"] == "ALIVE" and a["Pid"]
            and a["Name"].startswith(prefix) and a["Name"].endswith(suffix)]


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def until(check: Callable[[], Any], what: str = "condition",
                timeout_s: float = 5.0, every_s: float = 0.01) -> None:
    """`wait_until` inside a test's event loop: polls `check` between loop turns."""
    give_up = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


def arun(coro, timeout_s: float = HANG_S):
    """Run a coroutine in a fresh event loop, bounded by a hang guard (`HANG_S`)."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def hang_up_stream(base_url: str, model: str, events: int = 3,
                         max_tokens: int = 2000) -> int:
    """Start a long generate_stream of `model`, read `events` SSE events, then hang up
    (the client goes away mid-stream); the number of events read."""
    import aiohttp

    async with aiohttp.ClientSession() as s:
        body = {"text_input": "Going on and on ", "parameters": {"max_tokens": max_tokens}}
        r = await s.post(f"{base_url}/v2/models/{model}/generate_stream", json=body)
        seen = 0
        async for line in r.content:
            seen += line.startswith(b"data: ")
            if seen == events:
                break
        r.close()  # hang up
        return seen
