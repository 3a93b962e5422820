"""`raybatch join`: start this machine as a Ray node with its NUMA resources and labels.

`ray start` with this machine's numa<N> resources and `raybatch.io/*` labels
(`cluster.raynode`), and Serve's switches (`cluster.render.serve_environment`) in its
environment, so replicas placed on it pin themselves and Serve runs as `raybatch up`'s.
A user's `--resources` / `--labels` after `--` are merged into Raybatch's. Token
authentication is decided by `cluster.rayauth`: a head turns it on; a node joining
asks the head and brings the token (`--auth-token-file`) when the head wants one.
A node that misses Ray's fixed startup waits on a busy machine (`cluster.localray`) is
started again, up to `cluster.localray.TRIES` times, what the failed `ray start` left
ended first; any other end of `ray start` is its exit status.
"""

from __future__ import annotations

import argparse
import os

from cluster.rayauth import add_token_file_argument
from raybatch.args import non_negative, ray_address
from raybatch.serving import haproxy_available

POLL_S = 0.2  # how often the wait for `ray start` looks whether it ended (when it is silent)

JOIN_PROBE_S = 30.0
"""How long a joining node waits for its head to answer whether it wants a token (a
head being started at the same time has that long to come up)."""


def add_join_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", metavar="HOST:PORT", type=ray_address,
                   help="the cluster's head (its GCS address, as `ray start` prints it)")
    p.add_argument("--head", action="store_true",
                   help="start a head node instead, for other machines to join")
    p.add_argument("--num-cpus", type=non_negative(int),
                   help="CPUs of this node (default: Ray's count)")
    p.add_argument("--sysfs-root", metavar="DIR",
                   help="describe the machine from DIR laid out like /sys (default: "
                        "$RAYBATCH_SYSFS_ROOT, else /sys)")
    p.add_argument("--config", help="the YAML config whose Serve settings (ingress.haproxy) "
                                    "the node's environment gets (default: the bundled demo)")
    add_token_file_argument(p, "; a head without one generates ~/.ray/auth_token")
    p.add_argument("--dry-run", action="store_true",
                   help="print the `ray start` command and exit")
    p.add_argument("ray_args", nargs=argparse.REMAINDER,
                   help="after --, more `ray start` options (e.g. -- --object-store-memory N); "
                        "--resources JSON and --labels k=v,... are merged into the node's")


def join(args: argparse.Namespace) -> int:
    """Run `ray start` with this machine's numa<N> resources and labels; block until it ends."""
    import shlex
    import sys

    from cluster import rayauth
    from cluster.pinning import SYSFS_ROOT_ENV, sysfs_root
    from cluster.raynode import merge_node_options, ray_start_argv
    from cluster.topology import TopologyError, discover

    root = args.sysfs_root or sysfs_root()
    extra = args.ray_args[1:] if args.ray_args[:1] == ["--"] else args.ray_args
    try:
        topology = discover(root)
        argv = ray_start_argv(topology, address=args.address, head=args.head,
                              num_cpus=args.num_cpus, ray=_ray_executable(), extra=extra)
        notes = merge_node_options(topology, extra).notes
        auth = _auth_plan(args)
    except (TopologyError, ValueError, rayauth.AuthError) as e:
        print(f"raybatch join: {e}", file=sys.stderr)
        return 2
    print("$ " + shlex.join(argv), flush=True)
    for note in notes:
        print(note, flush=True)
    # The node's Ray processes (and the Serve controller, if it lands here) read Serve's
    # switches from this environment; a value already set wins.
    from cluster.config import load_default
    from cluster.render import serve_environment

    serve_env = serve_environment(load_default(args.config))
    if serve_env.pop("RAY_SERVE_ENABLE_HA_PROXY", None) and haproxy_available():
        serve_env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    env = {**serve_env, **os.environ, **({SYSFS_ROOT_ENV: root} if root else {})}
    env = rayauth.with_env(auth, env)  # the node's mode is the cluster's (never the token)
    print("with " + " ".join(f"{k}={env[k]}" for k in serve_env), flush=True)
    if auth.message:
        print(auth.message, flush=True)
    if args.dry_run:
        return 0
    if auth.generate is not None:
        rayauth.generate_token(auth.generate)
    return run_node(argv, env)


def _auth_plan(args: argparse.Namespace):
    """The node's token authentication (`cluster.rayauth`): a head's own; a joining
    node's asked of its head (not in a dry run: nothing is contacted then)."""
    from cluster import rayauth

    if args.head:
        return rayauth.head_plan(args.auth_token_file)
    if args.dry_run:
        return rayauth.AuthPlan({})
    address = rayauth.resolve_address(args.address) or args.address
    return rayauth.cluster_plan(address, args.auth_token_file, timeout_s=JOIN_PROBE_S,
                                must_answer=True)


def run_node(argv: list[str], env: dict[str, str]) -> int:
    """`ray start --block` (`argv`) until it ends; started again while it ends because the
    node missed Ray's fixed startup waits (`cluster.localray.TIMED_OUT` in its output,
    which is passed on as it comes), up to `TRIES` times, unless this process was asked
    to stop meanwhile. Each try's processes carry a mark of their own in their environment:
    what a failed try left (an agent, a GCS) is ended before the next."""
    import subprocess
    import uuid

    from cluster.localray import MARK_ENV, TIMED_OUT, TRIES, end_marked

    for n in range(1, TRIES + 1):
        mark = uuid.uuid4().hex
        proc = subprocess.Popen(argv, env={**env, MARK_ENV: mark}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        rc, stopped, said = _run_node(proc, TIMED_OUT)
        if rc == 0 or not said or stopped or n == TRIES:
            return rc
        print(f"raybatch join: the node did not start in time (try {n} of {TRIES}; a busy "
              "machine?); ending what it started and starting it again", flush=True)
        end_marked(mark)
    return rc


def _run_node(proc, watch: str) -> tuple[int, bool, bool]:
    """Pass on `ray start --block`'s output until it ends: its exit status, whether this
    process was asked to stop meanwhile, and whether its output said `watch`. It has ended
    once it exited and nothing it wrote is left unread: a process it started that keeps
    the pipe open (an orphan) does not hold `join` up. A SIGTERM or SIGHUP here (a service
    manager stopping `raybatch join`) is passed on, so the node drains and stops its
    processes rather than being left without its parent. Ctrl-C reaches both from the
    terminal already."""
    import codecs
    import select
    import signal

    stopped: list[int] = []

    def forward(signum: int, frame) -> None:
        stopped.append(signum)
        proc.send_signal(signum)

    before = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    fd, text = proc.stdout.fileno(), codecs.getincrementaldecoder("utf-8")("replace")
    said, tail = False, ""
    try:
        while True:
            try:
                readable = select.select([fd], [], [], POLL_S)[0]
            except KeyboardInterrupt:  # Ctrl-C reached `ray start` too: let it stop the node
                stopped.append(signal.SIGINT)
                continue
            if not readable:
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out = text.decode(chunk)
            print(out, end="", flush=True)
            tail = tail[-len(watch):] + out  # `watch` split across two reads is seen too
            said = said or watch in tail
        return proc.wait(), bool(stopped), said
    finally:
        proc.stdout.close()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _ray_executable() -> str:
    """The `ray` script of this Python environment, else whatever `ray` is on PATH."""
    import shutil
    import sys

    here = os.path.join(os.path.dirname(sys.executable), "ray")
    return here if os.access(here, os.X_OK) else (shutil.which("ray") or "ray")
