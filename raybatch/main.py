"""The `raybatch` command line: one entry point, one subcommand per job.

Subcommands import what they need when they run, so `raybatch --help` is fast
and a subcommand that needs Ray does not slow one that does not.
"""

from __future__ import annotations

import argparse
import importlib
import sys

DEMO_MAX_CLIENTS = 100_000


def _lazy(target: str):
    """A subcommand handler that imports 'module:function' only when it runs."""

    def run(args: argparse.Namespace) -> int:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(args)

    return run


def _build(args: argparse.Namespace) -> int:
    from cluster.config import load_default
    from cluster.modelpath import check_models
    from cluster.render import serve_config_yaml

    config = load_default(args.config)
    check_models(config)  # a wrong import path fails here, not when the file is deployed
    text = serve_config_yaml(config)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}: deploy it with `serve deploy {args.output}`")
    else:
        print(text, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from raybatch import serving
    from raybatch.args import between, non_negative, positive

    parser = argparse.ArgumentParser(prog="raybatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start (or join) Ray, deploy the app, serve until Ctrl-C")
    serving.add_up_arguments(up)
    up.set_defaults(func=_lazy("raybatch.serving:up"))

    down = sub.add_parser("down", help="stop every local `raybatch up` and end what a killed "
                                       "one left behind (HAProxy, Ray's processes)")
    down.add_argument("--timeout", type=non_negative(), default=20.0, metavar="S",
                      help="seconds a running `up` gets to stop before it is killed")
    down.set_defaults(func=_lazy("raybatch.runs:down"))

    join = sub.add_parser("join", help="start this machine as a Ray node (ray start) with its "
                                       "numa<N> resources and labels; block until stopped")
    from raybatch import join as join_cli

    join_cli.add_join_arguments(join)
    join.set_defaults(func=_lazy("raybatch.join:join"))

    st = sub.add_parser("status", help="models, replicas, queue depths, batch statistics")
    from raybatch import status as status_cli

    status_cli.add_status_arguments(st)
    st.set_defaults(func=_lazy("raybatch.status:status"))

    build = sub.add_parser("build", help="render a self-contained Serve config for serve deploy")
    build.add_argument("--config", help="YAML config (default: the bundled demo)")
    build.add_argument("-o", "--output", help="write here instead of stdout")
    build.set_defaults(func=_build)

    render = sub.add_parser("render", help="render deployment files from the config: "
                                           "`render k8s` (KubeRay RayService, PodMonitors, "
                                           "Grafana dashboard ConfigMap)")
    from raybatch import render as render_cli

    render_cli.add_arguments(render)

    demo = sub.add_parser("demo", help="run a demo model behind the embedded batcher under load")
    demo.add_argument("--model", choices=["square", "mlp", "sleep"], default="mlp")
    demo.add_argument("--concurrency", type=between(1, DEMO_MAX_CLIENTS, int), default=64,
                      help=f"concurrent clients (at most {DEMO_MAX_CLIENTS:,}: each is a "
                      "coroutine of this process)")
    demo.add_argument("--seconds", type=positive(), default=5.0, help="how long to send load")
    demo.add_argument("--max-batch-size", type=positive(int), default=64)
    demo.add_argument("--max-queue-delay-ms", type=non_negative(), default=2.0)
    demo.set_defaults(func=_lazy("raybatch.demo:run_demo"))

    sim = sub.add_parser("simulate", help="predict throughput and latency of a policy")
    from batching.simulate import cli as simulate_cli

    simulate_cli.add_arguments(sim)
    sim.set_defaults(func=_lazy("batching.simulate.cli:run"))

    dash = sub.add_parser("dashboard", help="render the Grafana dashboard of the config, or "
                                            "publish it to a Grafana")
    from raybatch import dashboard as dashboard_cli

    dashboard_cli.add_arguments(dash)

    topo = sub.add_parser("topology", help="NUMA nodes, cores and GPUs here, and the affinity plan")
    from raybatch import topology as topology_cli

    topology_cli.add_arguments(topo)
    topo.set_defaults(func=_lazy("raybatch.topology:run"))
    return parser


def main(argv: list[str] | None = None) -> int:
    from cluster.modelpath import ConfigError
    from cluster.rayauth import AuthError
    from raybatch.apphandle import StatusError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    # a line that says what to fix, not a traceback (OSError: a file it was told to write
    # or read, in the system's words)
    except (ConfigError, AuthError, StatusError, OSError) as e:
        print(f"raybatch {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
