"""The `raybatch` command line, one floor above what it deploys: it imports `cluster` (the
config, the plans) and `deployments` (the app), and nothing below imports it.

    main.py       the parser, one subcommand per job, each imported when it runs
    args.py       argument types: ports, positive numbers, refused before anything starts
    serving.py    up: bring the app up on Ray
    status.py     status: the running app's models, replicas, queues, batch statistics
    startup.py    up's deploy progress (what is pending, why) and its stop (Ctrl-C once, twice)
    runs.py       down, and what a killed up left behind: run records, ports, leftovers
    join.py       join: start this machine as a Ray node with its NUMA resources
    demo.py       the embedded batcher alone under load, no Ray
    topology.py   NUMA nodes, cores, GPUs and the affinity plan of this machine
    render.py     render k8s: the KubeRay manifests of a config (`cluster.k8s`)
    watch.py      status --watch: a live view per model (rates, queue, fill, waits)
    dashboard.py  dashboard render / publish: the Grafana dashboard of the config
"""

from raybatch.main import build_parser, main

__all__ = ["build_parser", "main"]
