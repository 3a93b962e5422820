"""Raybatch's batching engine: policies as pure state machines, the ledger, the hosts.

Never imports Ray: the same objects run inside a Ray actor, in-process
(`BatchedService`) and in the simulator. A map of the package:

The shared core (this folder)
    types.py      Request, Batch, Part, Failure, FlushReason: the values on the hot path
    tensors.py    TensorBatch (named tensors sharing the batch dim), Collate (ragged items
                  padded or listed when a batch is joined), lengths for grouping
    errors.py     the error hierarchy (QueueFull, DeadlineExceeded, ...) and its HTTP codes
    ledger.py     RequestId -> outcome: results matched by id, split requests joined, order kept
    latency.py    the batch-latency model learned online (a + b·cost)
    stats.py      per-batch statistics a host reports (and queue waits as bucket counts)
    metrics.py    the values a host hands the metrics Recorder it is given (per batch and
                  step, never per request; no metric names), NullRecorder, MemoryRecorder
    sizes.py      preferred batch sizes, the rule the dynamic and sequence policies share
    model.py      VectorTransformer, the interface of a batched model, and how a batch runs
    loop.py       LoopHost, the asyncio shell every host shares (one pump per tick, one timer)

One subpackage per kind of batching, each a policy (settings), an engine (a state
machine handed `now`) and a host (the asyncio loop around it)
    dynamic/      stateless models: DynamicPolicy, DynamicBatcher, BatchHost (and the
                  deadline admission: ServiceRate)
    sequence/     stateful models: SequencePolicy, SequenceBatcher, SequenceHost,
                  StatefulTransformer and the replica-side StateStore
    iterative/    generative models: IterativePolicy, IterativeScheduler, IterativeHost,
                  StepModel and the replica-side Generator

Running it
    embedded/     BatchedService: the engine in your own asyncio program, the model in a
                  worker process or thread
    simulate/     the same policies on a virtual clock: arrivals, simulate(), the report

Imports point one way: subpackages use the core, the core uses none of them.
"""

from batching.dynamic.batcher import DynamicBatcher
from batching.dynamic.policy import DynamicPolicy, QueuePolicy, TimeoutAction
from batching.errors import (
    BatchSizeMismatch,
    BatchTimedOut,
    Cancelled,
    DeadlineExceeded,
    Draining,
    InvalidRequest,
    ModelError,
    Overloaded,
    QueueFull,
    RaybatchError,
    SequenceLost,
    ServiceClosed,
    UnknownSequence,
    WorkerDied,
)
from batching.iterative.generative import Generator, StepModel
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest, IterativeScheduler
from batching.latency import LatencyModel
from batching.ledger import ItemFailed, Ledger, Outcome
from batching.metrics import MemoryRecorder, NullRecorder, Recorder
from batching.model import VectorTransformer, as_batch
from batching.sequence.batcher import SequenceBatcher, SequenceRequest
from batching.sequence.policy import SequencePolicy, SequenceStrategy
from batching.sequence.stateful import SequenceBatchInput, StatefulTransformer, StateStore
from batching.stats import BatchStats
from batching.tensors import Collate, Ragged, TensorBatch
from batching.types import Batch, Failure, FlushReason, Part, Request, RequestId

__all__ = [
    "Batch",
    "BatchSizeMismatch",
    "BatchStats",
    "BatchTimedOut",
    "BatchedService",
    "Cancelled",
    "Collate",
    "DeadlineExceeded",
    "Draining",
    "DynamicBatcher",
    "DynamicPolicy",
    "Failure",
    "FlushReason",
    "GenerateRequest",
    "Generator",
    "InvalidRequest",
    "ItemFailed",
    "IterativePolicy",
    "IterativeScheduler",
    "LatencyModel",
    "Ledger",
    "MemoryRecorder",
    "ModelError",
    "NullRecorder",
    "Outcome",
    "Overloaded",
    "Part",
    "QueueFull",
    "QueuePolicy",
    "Ragged",
    "RaybatchError",
    "Recorder",
    "Request",
    "RequestId",
    "SequenceBatchInput",
    "SequenceBatcher",
    "SequenceLost",
    "SequencePolicy",
    "SequenceRequest",
    "SequenceStrategy",
    "ServiceClosed",
    "StateStore",
    "StatefulTransformer",
    "StepModel",
    "TensorBatch",
    "TimeoutAction",
    "UnknownSequence",
    "VectorTransformer",
    "WorkerDied",
    "as_batch",
]


def __getattr__(name: str):
    # The embedded host pulls in asyncio and multiprocessing; load it on first use.
    if name == "BatchedService":
        from batching.embedded.service import BatchedService

        return BatchedService
    raise AttributeError(f"module 'batching' has no attribute {name!r}")
