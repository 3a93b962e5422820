"""What runs inside Ray: the Serve application and the actors behind it.

The runtime, in the order a request meets it
    app.py            build_app(config): the Serve application (ingress + batching actors)
    ingress.py        the Serve ingress: the handle API, and the HTTP app's backend (ServeBackend)
    route.py          ModelRoute: one model's way in (validation, deadline, shard choice),
                      shared by the ingress and RaybatchClient
    signature.py      a model's declared tensors: request inputs checked (numpy arrays of the
                      declared dtypes only), results as every output, ragged joins and
                      lengths, warm-up batches, the check of a model's answers
    backends.py       where a model's engine runs (batcher.placement): batching actors, or
                      this ingress replica (LocalEngine: any kind's host + its own
                      ReplicaPool; generation streams straight from the IterativeHost)
    coalesce.py       one loop tick of requests -> one Ray call per batch's worth
    client.py         RaybatchClient: a Python caller straight to the batching actors
    batcher.py        BatcherActor: one per model (or shard), hosts the engine
    hosts.py          which engine host a model's batching kind gets
    generation.py     generations multiplexed: one long poll per batching actor, not per token
    pool.py           ReplicaPool: min..max model replicas, scaling, death and replacement
    replica.py        ModelReplica: one model, one batch at a time, pinned to its cores
    inprocess.py      replicas.in_process: a replica on a thread of the engine's process
    warmup.py         the batches a replica runs before it reports ready (Triton's
                      model_warmup), and time to ready
    stateful_replica.py  SequenceReplica / StepReplica: per-sequence state on the replica
    heap.py           the batching actor's and model replicas' startup heap frozen out of the
                      garbage collector's walks (Serve does it for its replicas)
    stats.py          per-model statistics merged across shards (Triton's statistics extension)
    metrics.py        every raybatch_* Prometheus series in one table, and what records them
                      through ray.util.metrics (batching actor, replicas, callers, ingress)
    local.py          LocalApp: a local Ray of its own with one app, always torn down
                      (notebooks, scripts)

Subpackages
    http/             the HTTP front: OIP as a raw ASGI app, its limits and errors, the fast path
    protocol/         the Open Inference Protocol codec (no HTTP, no Ray)
    grpc/             the KServe v2 / Triton GRPCInferenceService through Serve's gRPC proxy
    models/           the demo models: square, sleep, mlp, minilm, twotower, accumulator,
                      gru, tinylm
    configs/          demo.yaml, what `raybatch up` deploys by default

Imports point one way: deployments -> cluster -> batching.
"""
