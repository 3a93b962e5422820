"""`raybatch render k8s`: the Kubernetes manifests of a config (`cluster.k8s`).

    raybatch render k8s --config my.yaml --image registry.example.com/raybatch:0.1.0 -o k8s/my
    kubectl apply -f k8s/my

Without `-o`, the manifests go to stdout as one YAML stream (`| kubectl apply -f -`).
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True)
    k8s = sub.add_parser("k8s", help="a RayService (KubeRay), PodMonitors and the Grafana "
                                     "dashboard's ConfigMap for the config")
    k8s.add_argument("--config", help="YAML config (default: $RAYBATCH_CONFIG, else the "
                                      "bundled demo)")
    k8s.add_argument("--image", help="image of the CPU pods (default: the config's "
                                     "kubernetes.image, else raybatch:<version>)")
    k8s.add_argument("--gpu-image", help="image of the GPU pods (default: the config's "
                                         "kubernetes.gpu_image, else the CPU image + '-gpu')")
    k8s.add_argument("--namespace", help="namespace of every object (default: none, so "
                                         "kubectl's current one)")
    k8s.add_argument("-o", "--output", metavar="DIR",
                     help="write one file per kind into DIR instead of printing them")
    k8s.set_defaults(func=render_k8s)


def render_k8s(args: argparse.Namespace) -> int:
    from cluster.config import ConfigError, load_default
    from cluster.k8s.manifests import header, render, to_yaml, write

    try:
        config = load_default(args.config)
        files = render(config, image=args.image, gpu_image=args.gpu_image,
                       namespace=args.namespace)
    except ConfigError as e:
        print(f"raybatch render k8s: {e}", file=sys.stderr)
        return 2
    source = args.config or os.environ.get("RAYBATCH_CONFIG")
    if not args.output:
        objects = [o for objects in files.values() for o in objects]
        print(to_yaml(objects, header(source)), end="")
        return 0
    for path in write(files, args.output, source):
        print(f"wrote {path}")
    print(f"apply them with `kubectl apply -f {args.output}` (KubeRay and, for the "
          f"PodMonitors, the Prometheus operator installed)")
    return 0
