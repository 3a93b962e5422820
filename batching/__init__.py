"""Raybatch's batching engine: policies as pure state machines, the ledger, the embedded host.

Never imports Ray: the same objects run inside a Ray actor, in-process
(`BatchedService`) and in the simulator.
"""

from batching.dynamic import DynamicBatcher
from batching.errors import (
    BatchSizeMismatch,
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    ModelError,
    QueueFull,
    RaybatchError,
    SequenceLost,
    ServiceClosed,
    UnknownSequence,
    WorkerDied,
)
from batching.generative import Generator, StepModel
from batching.iterative import GenerateRequest, IterativeScheduler
from batching.iterative_policy import IterativePolicy
from batching.latency import LatencyModel
from batching.ledger import ItemFailed, Ledger, Outcome
from batching.model import VectorTransformer
from batching.policy import DynamicPolicy, QueuePolicy, TimeoutAction
from batching.sequence import SequenceBatcher, SequenceRequest
from batching.sequence_policy import SequencePolicy, SequenceStrategy
from batching.stateful import StatefulTransformer, StateStore
from batching.stats import BatchStats
from batching.types import Batch, Failure, FlushReason, Part, Request, RequestId

__all__ = [
    "Batch",
    "BatchSizeMismatch",
    "BatchStats",
    "BatchedService",
    "Cancelled",
    "DeadlineExceeded",
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
    "ModelError",
    "Outcome",
    "Part",
    "QueueFull",
    "QueuePolicy",
    "RaybatchError",
    "Request",
    "RequestId",
    "SequenceBatcher",
    "SequenceLost",
    "SequencePolicy",
    "SequenceRequest",
    "SequenceStrategy",
    "ServiceClosed",
    "StateStore",
    "StatefulTransformer",
    "StepModel",
    "TimeoutAction",
    "UnknownSequence",
    "VectorTransformer",
    "WorkerDied",
]


def __getattr__(name: str):
    # The embedded host pulls in asyncio and multiprocessing; load it on first use.
    if name == "BatchedService":
        from batching.service import BatchedService

        return BatchedService
    raise AttributeError(f"module 'batching' has no attribute {name!r}")
