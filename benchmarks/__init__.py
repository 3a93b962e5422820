"""Benchmarks, grouped by what they measure; each prints ratios measured in one run.

    serve/       Raybatch through Ray Serve against `@serve.batch`; profiles of the ingress
    http/        the HTTP front and server, hostile clients, gRPC against HTTP
    engine/      the engine without Ray: embedded host, seed baseline, simulator, sweeps
    generation/  sequence batching and continuous batching of generation
    placement/   pinning, the replica actor's pipeline, start-up
    cluster/     a lab of hosts on one machine (netns, CPU quotas, faults) for multi-host runs
    common/      load generators, benchmark models, the notebooks' scale
    results/     dated records: each folder's README states the machine, load and commands

Run one with `python -m benchmarks.<group>.<name> --help`.
"""
