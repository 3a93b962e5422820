"""Raybatch through Ray Serve against Serve's own batching, and where its CPU goes.

    compare.py          Raybatch's setups against `serve` and `@serve.batch`, in one Ray
    settings.py         the comparison's settings, peers and named setups (default, gpu,
                        actor) plus one-off `--custom` specs
    measure.py          how one system is measured at one point (closed loop or wrk, /proc)
    models.py           the compared models (sleep, mlp, minilm), payloads, configs
    apps.py             the Serve baselines: plain Serve and `@serve.batch`
    drivers.py          HTTP bodies and URLs, stats pollers, CPU by process group
    probes.py           not product paths: one hop less, and what each hop costs
    report.py           the product-path targets and the table
    profile_ingress.py  py-spy on the process that serves, while it is driven
    client_roundtrip.py where a `RaybatchClient` bundle's round trip goes
    bundle_path.py      CPU of Raybatch's own Python per client request, no Ray
    metrics_overhead.py the same app with metrics on and off, ABBA rounds
    ragged.py           minilm on mixed lengths, group_by_length on and off
    reliability_times.py how fast overload, recovery, a burst and stopping are, against
                        their targets (the tests check only what happens)
"""
