"""`raybatch dashboard render` and `raybatch dashboard publish`: the app's Grafana dashboard.

`render` writes the dashboard JSON built from the config (`cluster.grafana`) to a
file or stdout; `publish` sends it to a Grafana with `grafana-client` and prints
where it opens and its version. A failure prints one line saying what to fix and
exits 1. Neither needs Ray.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dashboard_command", required=True)
    render = sub.add_parser("render", help="write the Grafana dashboard JSON of the config")
    _common(render)
    render.add_argument("-o", "--output", help="write here instead of stdout")
    render.set_defaults(func=run_render)

    pub = sub.add_parser("publish", help="publish the dashboard to a Grafana (overwriting "
                                         "the previous version)")
    _common(pub)
    pub.add_argument("--url", required=True, help="Grafana's URL, e.g. http://grafana:3000")
    pub.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                     help="a service-account token (default: $GRAFANA_TOKEN)")
    pub.add_argument("--user", help="basic-auth user (with --password), instead of a token")
    pub.add_argument("--password", help="basic-auth password")
    pub.add_argument("--folder", help="folder title (created if missing; default: General)")
    pub.set_defaults(func=run_publish)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: $RAYBATCH_CONFIG, else the demo)")
    p.add_argument("--title", help="dashboard title (default: 'Raybatch: <app_name>')")
    p.add_argument("--uid", help="dashboard uid (default: derived from app_name, stable)")


def _dashboard(args: argparse.Namespace) -> dict:
    from cluster.config import load_default
    from cluster.grafana.dashboard import render_dashboard

    return render_dashboard(load_default(args.config), title=args.title, uid=args.uid)


def run_render(args: argparse.Namespace) -> int:
    import json

    from cluster.config import ConfigError

    try:
        text = json.dumps(_dashboard(args), indent=2) + "\n"
    except ConfigError as e:
        print(f"raybatch dashboard render: {e}", file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}: import it in Grafana, or `raybatch dashboard publish`")
    else:
        sys.stdout.write(text)
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from cluster.config import ConfigError
    from cluster.grafana.publish import PublishError, publish

    try:
        dashboard = _dashboard(args)
        done = publish(dashboard, args.url, token=args.token if not args.user else None,
                       user=args.user, password=args.password, folder=args.folder)
    except (PublishError, ConfigError) as e:
        print(f"raybatch dashboard publish: {e}", file=sys.stderr)
        return 1
    where = f" in folder {done.folder!r}" if done.folder else ""
    print(f"published {dashboard['title']!r}{where}: {done.url} (version {done.version})")
    return 0
