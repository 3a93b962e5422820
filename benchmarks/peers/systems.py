"""The systems of the comparison: how each is started, asked, checked and stopped.

Every system serves the same mlp (256→1024→256, one torch thread, one instance, max
batch 64, 2 ms delay) on 127.0.0.1, started as a process of its own in a session of
its own (so its CPU is read from /proc apart from the load generator's):

- raybatch: the product's own `raybatch up` with the demo config (deployments/configs/
  demo.yaml) cut down to its `mlp` entry at one replica: own HTTP server on the native
  port, the mission's shape (the engine in a batching actor, the model in a replica
  actor). OIP binary and OIP JSON.
- raybatch.inproc: the same with the in-process shortcut (`batcher.placement: ingress`,
  `replicas.in_process: true`: engine and replica in the ingress), nothing else changed.
- raybatch.ingress-engine: the engine in the ingress, the model still in a replica actor on
  the direct connection (`batcher.placement: ingress`): the mission's shape without its
  batching actor, i.e. what the batching actor's own hop pair and process cost on this
  machine (a bound for any change that keeps the batching actor on a request's path).
- triton: `tritonserver` 2.51 from PyPI's nvidia-pytriton, a Python-backend model.py,
  dynamic batcher 64 / 2 ms, `--http-thread-count` = cores (its fastest here; later
  `--triton-arg`s override it). The same OIP bytes as Raybatch's, binary and JSON.
- mosec: mosec 0.9.8, Rust front, one Python worker, batch 64 / 2 ms; one server with
  msgpack (raw FP32 bytes both ways), one with an orjson worker (JSON lists).
- serve.batch: Ray Serve's `@serve.batch` (`benchmarks.serve.apps.Batched`, Serve's
  fastest documented settings as `benchmarks.serve.compare` sets them), OIP binary.
- litserve: LitServe 0.2.19, JSON `{"input": [...]}`, batch 64 / 2 ms.

A variant's `kind` ("binary" or "json") says which Raybatch row its ratio is taken
against: raw-byte bodies (OIP binary, msgpack) against OIP binary, JSON against JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import orjson
import yaml

from benchmarks.peers.install import PeerEnv
from benchmarks.peers.measure import proc_table, server_pids
from benchmarks.serve.drivers import http_body

REPO = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
SYSTEMS = ("raybatch", "raybatch.inproc", "raybatch.ingress-engine", "triton", "mosec",
           "serve.batch", "litserve")
OIP_PATH = "/v2/models/mlp/infer"
# raybatch.ingress-engine's settings over the demo's mlp: its engine in the ingress replica
# (not in a batching actor, nor shared with a group's), its model still in a replica actor
INGRESS_ENGINE = {"batcher": {"placement": "ingress", "group": None}}


@dataclass(frozen=True)
class Variant:
    """One kind of request to one server: its body, where it goes, how to read the answer."""

    system: str
    title: str      # the table's "system" column
    request: str    # the table's "request" column
    kind: str       # "binary" or "json": the Raybatch row it is compared with
    path: str
    body: bytes
    headers: dict[str, str]
    decode: Callable[[dict[str, str], bytes], np.ndarray]


@dataclass
class Server:
    """A started server: its process (a session leader), base URL, variants and stats."""

    name: str
    proc: subprocess.Popen
    base_url: str
    variants: list[Variant]
    stats: Callable[[], tuple[int, int] | None]
    log: Path
    ready_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# -- request bodies and answers ---------------------------------------------------------------
def decode_oip(headers: dict[str, str], data: bytes) -> np.ndarray:
    """OUTPUT0 of an OIP answer: binary (Inference-Header-Content-Length) or JSON."""
    n = headers.get("inference-header-content-length")
    if n is None:
        out = json.loads(data)["outputs"][0]
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    header = json.loads(data[: int(n)])
    out = header["outputs"][0]
    raw = data[int(n): int(n) + out["parameters"]["binary_data_size"]]
    return np.frombuffer(raw, dtype=np.float32).reshape(out["shape"])


def oip_variants(system: str, title: str, x: np.ndarray) -> list[Variant]:
    out = []
    for binary in (True, False):
        body, headers = http_body(x, binary)
        out.append(Variant(system, title, "OIP binary" if binary else "OIP JSON",
                           "binary" if binary else "json", OIP_PATH, body, headers, decode_oip))
    return out


def mosec_variant(x: np.ndarray, msgpack_body: bool) -> Variant:
    title = "mosec 0.9.8 (Rust front, one Python worker, batch 64 / 2 ms)"
    if msgpack_body:
        return Variant("mosec", title, "msgpack (raw FP32 bytes)", "binary", "/inference",
                       msgpack.packb(x.astype(np.float32).tobytes()),
                       {"Content-Type": "application/msgpack"},
                       lambda h, d: np.frombuffer(msgpack.unpackb(d), dtype=np.float32))
    return Variant("mosec", title.replace(")", ", orjson worker)"), "JSON", "json",
                   "/inference", orjson.dumps(x.ravel().tolist()),
                   {"Content-Type": "application/json"},
                   lambda h, d: np.asarray(orjson.loads(d), dtype=np.float32))


def litserve_variant(x: np.ndarray) -> Variant:
    return Variant("litserve", "LitServe 0.2.19 (batch 64 / 2 ms)", "JSON", "json", "/predict",
                   orjson.dumps({"input": x.ravel().tolist()}),
                   {"Content-Type": "application/json"},
                   lambda h, d: np.asarray(orjson.loads(d)["output"], dtype=np.float32))


# -- processes --------------------------------------------------------------------------------
def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None, stdin: bool = False) -> subprocess.Popen:
    """`argv` as the leader of a new session, stdout and stderr to `log`."""
    with open(log, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)


def log_tail(log: Path, n: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def wait_ready(server: Server, timeout_s: float) -> None:
    """Poll `server.ready_url` (GET) until 200; fail early if the server exits."""
    give_up = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited ({server.proc.returncode}) before it "
                               f"was ready:\n{log_tail(server.log)}")
        try:
            with urllib.request.urlopen(server.ready_url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > give_up:
            raise RuntimeError(f"{server.name} not ready after {timeout_s:.0f} s:\n"
                               f"{log_tail(server.log)}")
        time.sleep(0.5)


def stop(server: Server, grace_s: float = 40.0) -> None:
    """SIGTERM the server's root process (it stops its own children: Ray's `serve.delete`,
    mosec's and LitServe's workers), then SIGKILL whatever of its processes is left, the
    root's orphans included (the session is the root's pid: `start_new_session`)."""
    proc = server.proc
    members = server_pids(proc_table(), proc.pid, sid=proc.pid)
    if server.extra.get("quit") and proc.poll() is None:
        try:
            server.extra["quit"]()
        except (OSError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    give_up = time.monotonic() + 10
    while True:
        proc.poll()  # reap the root, if it has ended, so it is not seen as left
        procs = proc_table()
        left = (server_pids(procs, proc.pid, sid=proc.pid) | (members & procs.keys())) - {
            os.getpid()}
        if not left or time.monotonic() > give_up:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def oip_stats(base_url: str) -> Callable[[], tuple[int, int] | None]:
    """(batches, items) from the Triton-style statistics route, which both serve."""
    def read() -> tuple[int, int] | None:
        try:
            with urllib.request.urlopen(f"{base_url}/v2/models/mlp/stats", timeout=5) as r:
                s = json.loads(r.read())["model_stats"][0]
            return int(s["execution_count"]), int(s["inference_count"])
        except (OSError, KeyError, IndexError, ValueError):
            return None
    return read


def file_stats(path: Path) -> Callable[[], tuple[int, int] | None]:
    """(batches, items) the peer's model writes (at most every 0.2 s): approximate."""
    def read() -> tuple[int, int] | None:
        try:
            s = json.loads(path.read_text())
            return int(s["batches"]), int(s["items"])
        except (OSError, KeyError, ValueError):
            return None
    return read


def model_input_and_answer() -> tuple[np.ndarray, np.ndarray]:
    """The one request item every system gets, and the model's own answer to it."""
    from batching.model import run_batch
    from benchmarks.serve.models import bench_models
    from deployments.models import MLP

    x = bench_models()["mlp"].payloads(1)[0]  # [1, 256] float32, seeded
    model = MLP()
    model.setup("cpu")
    return x, np.asarray(run_batch(model, x), dtype=np.float32)


# -- the systems ------------------------------------------------------------------------------
def raybatch_config(tmp: Path, inproc: bool = False, repo: Path = REPO,
                    override: dict[str, dict] | None = None) -> Path:
    """`repo`'s demo config with only its mlp, at one replica (one model instance); `inproc`:
    with the in-process shortcut (engine and replica in the ingress), nothing else changed;
    `override`: settings merged into the mlp's sections, for an experiment."""
    cfg = yaml.safe_load((repo / "deployments/configs/demo.yaml").read_text())
    mlp = next(m for m in cfg["models"] if m["name"] == "mlp")
    mlp["replicas"] = {**mlp["replicas"], "min_replicas": 1, "max_replicas": 1}
    if inproc:
        mlp["replicas"]["in_process"] = True
        mlp["batcher"] = {"placement": "ingress"}
    for section, values in (override or {}).items():
        mlp[section] = {**mlp.get(section, {}), **values}
    cfg["models"] = [mlp]
    tag = "" if repo == REPO else "-" + repo.name
    if override:  # a file of its own for each set of overrides: systems may share `tmp`
        tag += "-" + hashlib.sha1(json.dumps(override, sort_keys=True).encode()).hexdigest()[:8]
    path = tmp / (f"raybatch-mlp{tag}-inproc.yaml" if inproc else f"raybatch-mlp{tag}.yaml")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_raybatch(x: np.ndarray, port: int, tmp: Path, peers: PeerEnv,
                   inproc: bool = False, repo: Path = REPO, name: str | None = None,
                   override: dict[str, dict] | None = None) -> Server:
    """`raybatch up` of the checkout `repo` (another one: an earlier version, its
    extensions built in place, run from its own folder and Python path); `override`: as
    `raybatch_config`'s."""
    native = port + 1
    # the command line's package: raybatch/, or cluster/cli/ in versions before it moved
    cli = "raybatch" if (repo / "raybatch" / "__init__.py").exists() else "cluster.cli"
    argv = [sys.executable, "-c", f"from {cli} import main; main()", "up",
            "--config", str(raybatch_config(tmp, inproc, repo, override)),
            "--host", "127.0.0.1",
            "--port", str(port), "--native-port", str(native)]
    name = name or ("raybatch.inproc" if inproc else "raybatch")
    log = tmp / f"{name}.log"
    engine_in_ingress = (override or {}).get("batcher", {}).get("placement") == "ingress"
    base = f"http://127.0.0.1:{native}"
    proc = spawn(argv, log, env={"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}, cwd=repo)
    title = ("Raybatch, in-process shortcut (native front; engine and replica in the ingress)"
             if inproc else
             "Raybatch, engine in the ingress (native front; a replica actor, no batching actor)"
             if engine_in_ingress else
             "Raybatch (demo settings: native front; a batching actor and a replica actor)")
    s = Server(name, proc, base, oip_variants(name, title, x), oip_stats(base), log,
               ready_url=f"{base}/v2/models/mlp/ready")
    wait_ready(s, 300)
    return s


def triton_repository(tmp: Path) -> Path:
    repo = tmp / "triton-models"
    version = repo / "mlp" / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy(APPS / "triton_model.py", version / "model.py")
    shutil.copy(APPS / "peer_model.py", version / "peer_model.py")
    (repo / "mlp" / "config.pbtxt").write_text(
        'name: "mlp"\nbackend: "python"\nmax_batch_size: 64\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
        'dynamic_batching { max_queue_delay_microseconds: 2000 }\n')
    return repo


def start_triton(x: np.ndarray, port: int, tmp: Path, peers: PeerEnv,
                 extra_args: tuple[str, ...] = ()) -> Server:
    argv = [str(peers.tritonserver), f"--model-repository={triton_repository(tmp)}",
            f"--backend-directory={peers.triton_backends}", "--http-address=127.0.0.1",
            f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false",
            "--log-verbose=0", "--log-info=false",
            # HTTP threads = cores: Triton's default (8) gives ~40% fewer req/s on 2 cores
            f"--http-thread-count={os.cpu_count() or 1}", *extra_args]
    log = tmp / "triton.log"
    base = f"http://127.0.0.1:{port}"
    proc = spawn(argv, log, env=peers.triton_env())
    title = ("Triton 2.51 (`tritonserver` from PyPI's nvidia-pytriton, Python-backend "
             "model.py, dynamic batcher 64 / 2 ms)")
    s = Server("triton", proc, base, oip_variants("triton", title, x), oip_stats(base), log,
               ready_url=f"{base}/v2/models/mlp/ready")
    wait_ready(s, 180)
    return s


def start_mosec(x: np.ndarray, port: int, tmp: Path, peers: PeerEnv,
                msgpack_body: bool) -> Server:
    variant = "msgpack" if msgpack_body else "json"
    stats = tmp / f"mosec-{variant}-stats.json"
    log = tmp / f"mosec-{variant}.log"
    argv = [str(peers.python), str(APPS / "mosec_app.py"), "--port", str(port),
            "--address", "127.0.0.1", "--log-level", "error"]
    proc = spawn(argv, log, env={"PEER_VARIANT": variant, "PEER_STATS": str(stats),
                                 "OMP_NUM_THREADS": "1"}, cwd=APPS)
    base = f"http://127.0.0.1:{port}"
    s = Server(f"mosec-{variant}", proc, base, [mosec_variant(x, msgpack_body)],
               file_stats(stats), log, ready_url=f"{base}/")
    wait_ready(s, 120)
    return s


def start_litserve(x: np.ndarray, port: int, tmp: Path, peers: PeerEnv) -> Server:
    stats = tmp / "litserve-stats.json"
    log = tmp / "litserve.log"
    proc = spawn([str(peers.python), str(APPS / "litserve_app.py"), str(port)], log,
                 env={"PEER_STATS": str(stats), "OMP_NUM_THREADS": "1"}, cwd=APPS)
    base = f"http://127.0.0.1:{port}"
    s = Server("litserve", proc, base, [litserve_variant(x)], file_stats(stats), log,
               ready_url=f"{base}/health")
    wait_ready(s, 180)
    return s


def start_serve_batch(x: np.ndarray, port: int, tmp: Path, peers: PeerEnv) -> Server:
    """`benchmarks.peers.ray_host`: Ray + Serve + `@serve.batch`; it prints `READY <url>`,
    then answers `stats` on stdin with a JSON line and stops on `quit`."""
    log = tmp / "serve-batch.log"
    argv = [sys.executable, "-m", "benchmarks.peers.ray_host", "--port", str(port),
            "--ready-file", str(tmp / "serve-batch.ready")]
    proc = spawn(argv, log, env={"PYTHONPATH": str(REPO)}, cwd=REPO, stdin=True)
    ready = tmp / "serve-batch.ready"
    give_up = time.monotonic() + 300
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > give_up:
            stop(Server("serve.batch", proc, "", [], lambda: None, log))
            raise RuntimeError(f"serve.batch did not come up:\n{log_tail(log)}")
        time.sleep(0.5)
    info = json.loads(ready.read_text())
    lock = threading.Lock()

    def stats() -> tuple[int, int] | None:
        with lock:
            out = tmp / "serve-batch.stats"
            out.unlink(missing_ok=True)
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"stats\n")
                proc.stdin.flush()
            except OSError:
                return None
            give = time.monotonic() + 10
            while not out.exists() and time.monotonic() < give:
                time.sleep(0.01)
            try:
                s = json.loads(out.read_text())
            except (OSError, ValueError):
                return None
            return int(s["batches"]), int(s["items"])

    def quit_() -> None:
        assert proc.stdin is not None
        proc.stdin.write(b"quit\n")
        proc.stdin.flush()
        proc.wait(timeout=60)

    body, headers = http_body(x, True)
    v = Variant("serve.batch", "Ray Serve `@serve.batch` (Raybatch's OIP codec)", "OIP binary",
                "binary", "", body, headers, decode_oip)
    return Server("serve.batch", proc, info["url"], [v], stats, log,
                  extra={"quit": quit_})


Starter = Callable[[np.ndarray, int, Path, PeerEnv], Server]


def starters(triton_args: tuple[str, ...] = ()) -> dict[str, list[Starter]]:
    """system -> its servers' start functions, in order (mosec: msgpack, then orjson).
    `triton_args`: more `tritonserver` options (e.g. `--http-thread-count=4`)."""
    return {
        "raybatch": [start_raybatch],
        "raybatch.inproc": [lambda x, p, t, e: start_raybatch(x, p, t, e, inproc=True)],
        "raybatch.ingress-engine": [lambda x, p, t, e: start_raybatch(
            x, p, t, e, name="raybatch.ingress-engine", override=INGRESS_ENGINE)],
        "triton": [lambda x, p, t, e: start_triton(x, p, t, e, triton_args)],
        "mosec": [lambda x, p, t, e: start_mosec(x, p, t, e, True),
                  lambda x, p, t, e: start_mosec(x, p + 1, t, e, False)],
        "serve.batch": [start_serve_batch],
        "litserve": [start_litserve],
    }


PORT_OFFSET = {"raybatch": 0, "raybatch.inproc": 5, "raybatch.ingress-engine": 40, "triton": 10,
               "mosec": 20, "litserve": 30, "serve.batch": 100}
