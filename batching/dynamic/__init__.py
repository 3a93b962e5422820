"""Dynamic batching, for stateless models (Triton's dynamic batcher, and more).

    policy.py     DynamicPolicy (max batch size, queue delay, preferred sizes, priority
                  levels with a QueuePolicy each, costs, adaptive delay): what a user writes
    queues.py     one level's queue: earliest deadline first, delayed requests apart
    batcher.py    DynamicBatcher: submit / next_batch / deadline / complete / cancel,
                  handed `now`; splits requests across batches by cost
    host.py       BatchHost: the asyncio loop that runs the batcher against replicas
                  (least outstanding work, pipelined, a dead replica's batches retried once)
"""

from batching.dynamic.batcher import DynamicBatcher
from batching.dynamic.host import BatchHost, ReplicaClient
from batching.dynamic.policy import DynamicPolicy, QueuePolicy, TimeoutAction

__all__ = ["BatchHost", "DynamicBatcher", "DynamicPolicy", "QueuePolicy", "ReplicaClient",
           "TimeoutAction"]
