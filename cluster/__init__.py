"""The machine and the cluster: configuration, topology, placement, rendering, the CLI.

    config.py     RaybatchConfig: the one YAML file (models, batching, replicas, ingress)
    tensorspec.py a model's declared tensors (datatype, shape, ragged axis), part of it
    replicas.py   a model's replicas: counts, reservations, pinning, in process or actors
    appsettings.py the app-wide part of it: ingress (ports, limits, drain, logging), metrics
    modelpath.py  a user's model class: python_path, importing it with errors that say
                  what to fix, and whether it fits its batching kind
    topology.py   NUMA nodes, cores, SMT siblings, GPUs, cgroup limits, read from sysfs
    affinity.py   the affinity plan: which cores the batcher and each replica get
    pinning.py    a replica pins itself (node-local core allocator, sched_setaffinity)
    raynode.py    numa<N> resources and labels of a Ray node; `ray start` arguments
    render.py     what Ray deploys, derived from the config: the Serve config file
    ports.py      a free port for a server about to bind it, outside the ephemeral range
    k8s/          Kubernetes manifests (KubeRay RayService, PodMonitors) from the config
    grafana/      the Grafana dashboard derived from the config, and publishing it
    cli/          the `raybatch` command line, on top of everything (it may import
                  `deployments`; nothing else in `cluster` does)

Imports point one way: deployments -> cluster -> batching.
"""
