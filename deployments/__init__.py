"""What runs inside Ray: the Serve application and the actors behind it.

The runtime, in the order a request meets it
    app.py            build_app(config): the Serve application (ingress + batching actors)
    ingress.py        the Serve ingress: OIP over HTTP (infer, generate, SSE) and the handle API
    route.py          ModelRoute: one model's way in (validation, deadline, shard choice),
                      shared by the ingress and RaybatchClient
    coalesce.py       one loop tick of requests -> one Ray call per batch's worth
    client.py         RaybatchClient: a Python caller straight to the batching actors
    batcher.py        BatcherActor: one per model (or shard), hosts the engine
    hosts.py          which engine host a model's batching kind gets
    generation.py     generations multiplexed: one long poll per batching actor, not per token
    pool.py           ReplicaPool: min..max model replicas, scaling, death and replacement
    replica.py        ModelReplica: one model, one batch at a time, pinned to its cores
    stateful_replica.py  SequenceReplica / StepReplica: per-sequence state on the replica
    stats.py          per-model statistics merged across shards (Triton's statistics extension)
    local.py          LocalApp: a local Ray of its own with one app, always torn down
                      (notebooks, scripts)

Subpackages
    protocol/         the Open Inference Protocol codec (no HTTP, no Ray)
    models/           the demo models: square, sleep, mlp, minilm, accumulator, gru, tinylm
    configs/          demo.yaml, what `raybatch up` deploys by default

Imports point one way: deployments -> cluster -> batching.
"""
