"""What runs inside Ray: the Serve application and the processes behind it, one wing each.

A request meets them in this order (a wing is a folder; `⇢` is a hop between processes)
    ingress/   the Serve ingress replica, and any caller's process
        deployment.py  the Serve ingress: the handle API, the HTTP app's backend (ServeBackend)
        route.py       ModelRoute: one model's way in (validation, deadline, engine choice)
        placement.py   where a model's engine runs (batcher.placement): batching actors, or
                       this ingress replica (LocalEngine: the host and its own ReplicaPool)
        coalesce.py    one loop tick of requests -> one bundle per batch's worth
        client.py      RaybatchClient: a Python caller straight to the batching actors
        drain.py       finishing what was accepted on delete and redeploy (ingress side)
      ⇢ wire/      what crosses a hop, in both directions
        bundles.py     the record of a request (Entry: its one deadline, read on arrival),
                       of its answer (Outcome), and a bundle of them, stacked
        withdraw.py    the partial cancel: rows of a block whose clients went away
        link.py        a direct connection to an actor (the caller's end, framing)
        endpoint.py    where it listens: a Unix socket on one node, TCP between nodes
        dialer.py      when a caller has a direct connection and when a Ray call goes
        keepalive.py   when a connection's other end is taken for lost
        generation.py  generation streams between the ingress and its batching actor
    batcher/   the batching actor (or the engine placed in the ingress)
        actor.py       BatcherActor: one per model (or group), hosts the engine
        hosts.py       which engine host a model's batching kind gets
        attachments.py the actor's side of draining: which ingress replicas use it
      ⇢ replica/   the model replicas, and how an engine reaches them
        pool.py        ReplicaPool: min..max replicas, scaling, death and replacement
        client.py      RayReplicaClient: a replica actor as its engine calls it
        actor.py       ModelReplica: one model, one batch at a time, pinned to its cores
        link_server.py the replica's end of the direct connection (plain threads)
        stateful.py    SequenceReplica / StepReplica: per-sequence state on the replica
        inprocess.py   replicas.in_process: a replica on a thread of the engine's process
        warmup.py      the batches a replica runs before it reports ready

Shared by every process (the only modules at this level)
    app.py        build_app(config): the Serve application (ingress + batching actors)
    signature.py  a model's declared tensors: inputs checked, outputs, ragged joins,
                  warm-up batches, the check of a model's answers
    metrics.py    every raybatch_* Prometheus series in one table, and what records them
    heap.py       the startup heap frozen out of the garbage collector's walks
    local.py      LocalApp: a local Ray of its own with one app, always torn down

Subpackages the ingress serves through
    http/         the HTTP front door: oip/ (the app any server runs), pyserver/ (Raybatch's
                  HTTP/1.1 server), native/ (the native front)
    grpc/         the KServe v2 / Triton GRPCInferenceService
    protocol/     the Open Inference Protocol codec (no HTTP, no Ray)
    models/       the demo models; configs/: demo.yaml, what `raybatch up` deploys by default

Imports point one way: raybatch (the CLI) -> deployments -> cluster -> batching; inside,
ingress -> batcher -> replica -> wire (tests/unit/test_layers.py holds both).
"""
