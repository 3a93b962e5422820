"""Kubernetes manifests (KubeRay) rendered from a `RaybatchConfig`: `raybatch render k8s`.

    settings.py    the config's `kubernetes:` block: pod sizes, images, autoscaling
    sizing.py      which worker group each model goes to; min and max pods per group
    pods.py        containers, ports, resources, security contexts, a pod's numa<N> and labels
    rayservice.py  the RayService: the Serve config of `raybatch build` on an autoscaled cluster
    monitoring.py  PodMonitors for Prometheus; the Grafana dashboard's ConfigMap
    manifests.py   every object of a config by file name; YAML at the edge

Pure functions from the config to dicts. This facade imports nothing, so
`cluster.config` can take its settings from `settings.py` without a cycle.
"""
