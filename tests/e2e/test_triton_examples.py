"""Triton's own example client programs, unchanged, against `configs/triton-examples.yaml`.

The programs (tests/e2e/triton_examples/, pinned to one commit of Triton's client
repository, checked here to be byte for byte that commit's) run as subprocesses with
`-u host:port` and must exit 0, over three endpoints (each through
`run_triton_example.py`, which closes the HTTP clients a program leaves open before
the interpreter's shutdown: their `__del__` can hang there, in gevent):
- `native`: Raybatch's own HTTP server (`ingress.native_port`), at its root;
- `serve`: Serve's HTTP port, under the app's route prefix (the app is deployed beside
  the session's shared one, so it has a prefix of its own; tritonclient takes it in the
  URL: `-u 127.0.0.1:PORT/triton-examples`);
- `grpc`: Serve's gRPC proxy. With several applications on it, Serve routes a call by
  its `application` metadata, which the programs cannot send; a pass-through here adds
  it and forwards every call's bytes as they are (status codes and details too). With
  the app alone on Serve, as `raybatch up --config triton-examples.yaml` deploys it,
  none is needed.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "triton_examples"
RUNNER = Path(__file__).parent / "run_triton_example.py"
CONFIG = ROOT / "deployments" / "configs" / "triton-examples.yaml"
APP, PREFIX = "triton-examples-test", "/triton-examples"
HTTP = sorted(p.name for p in PROGRAMS.glob("simple_http_*.py"))
GRPC = sorted(p.name for p in PROGRAMS.glob("simple_grpc_*.py"))
RUNS = [(p, e) for p in HTTP for e in ("native", "serve")] + [(p, "grpc") for p in GRPC]


def test_the_programs_are_tritons_unchanged():
    """Each file is the git blob the README names (the pinned commit's)."""
    listed = dict(re.findall(r"\| `(simple_\w+\.py)` \| `([0-9a-f]{40})` \|",
                             (PROGRAMS / "README.md").read_text()))
    assert sorted(listed) == sorted(HTTP + GRPC) and len(listed) == 12
    for name, blob in listed.items():
        data = (PROGRAMS / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name
    assert "NVIDIA CORPORATION" in (PROGRAMS / "LICENSE").read_text()


class AddApplication(grpc.GenericRpcHandler):
    """A gRPC pass-through that adds Serve's `application` metadata to every call."""

    def __init__(self, target: str, app: str) -> None:
        self.app = app
        self.channel = grpc.insecure_channel(target)
        self.server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[self])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def service(self, details):  # every method, its messages as raw bytes
        call = self.channel.unary_unary(details.method)

        def forward(request: bytes, context) -> bytes:
            metadata = [(k, v) for k, v in context.invocation_metadata()
                        if not k.startswith(("grpc-", ":")) and k != "user-agent"]
            try:
                return call(request, metadata=[*metadata, ("application", self.app)],
                            timeout=60)
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())

        return grpc.unary_unary_rpc_method_handler(forward)

    def close(self) -> None:
        self.server.stop(None)
        self.channel.close()


@pytest.fixture(scope="module")
def urls(app):
    """The example config deployed beside the shared app; each endpoint's `-u` value."""
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app

    data = yaml.safe_load(CONFIG.read_text())
    native = free_port()
    data["app_name"] = APP
    data["ingress"].update(route_prefix=PREFIX, native_port=native, port=app.port,
                           grpc_port=app.grpc_port)
    config = load_config(data)
    serve.run(build_app(config), name=APP, route_prefix=PREFIX)
    forward = AddApplication(f"127.0.0.1:{app.grpc_port}", APP)
    yield {"native": f"127.0.0.1:{native}", "serve": f"127.0.0.1:{app.port}{PREFIX}",
           "grpc": f"127.0.0.1:{forward.port}"}
    forward.close()
    serve.delete(APP)


@pytest.mark.parametrize(("program", "endpoint"), RUNS, ids=[f"{p[7:-3]}-{e}" for p, e in RUNS])
def test_tritons_example_program_passes_unchanged(urls, program, endpoint):
    command = [sys.executable, str(RUNNER), str(PROGRAMS / program), "-u", urls[endpoint]]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              cwd=PROGRAMS)
    except subprocess.TimeoutExpired as e:  # what it printed says where it stopped
        said = b"".join(x or b"" for x in (e.stdout, e.stderr)).decode(errors="replace")
        pytest.fail(f"{program} did not end in 120 s; its output:\n{said[-4000:]}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # Some programs exit 0 when they cannot connect: that is no pass either.
    assert "creation failed" not in output, output[-4000:]
    if "PASS" in (PROGRAMS / program).read_text():  # those that say so, said so
        assert "PASS" in proc.stdout, output[-4000:]
