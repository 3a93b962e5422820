"""The embedded service: the batching engine inside your own asyncio program, no Ray.

    service.py    BatchedService: submit / submit_many / stats / close, over a BatchHost
    runners.py    where the model runs: ProcessRunner (a worker process, so batching
                  overlaps compute) or ThreadRunner (in-process)
    worker.py     the worker process's side: build the model, run batches, send results
"""

from batching.embedded.service import BatchedService

__all__ = ["BatchedService"]
