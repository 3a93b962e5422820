"""The `raybatch` command line: the one place in `cluster` that may import `deployments`.

    main.py       the parser, one subcommand per job, each imported when it runs
    serving.py    up, join, status: bring the app up on Ray, add nodes, look at it
    demo.py       the embedded batcher alone under load, no Ray
    topology.py   NUMA nodes, cores, GPUs and the affinity plan of this machine
    render.py     render k8s: the KubeRay manifests of a config (`cluster.k8s`)
"""

from cluster.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
