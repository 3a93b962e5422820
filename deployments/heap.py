"""Python's cyclic garbage collector in a long-running replica: what startup allocated is
frozen out of its walks.

A replica imports Ray, Serve, torch, numpy and its model: a heap of objects that live as
long as the process. The cyclic collector walks every tracked object of the generation it
collects, and the oldest generation holds all of those; under load a replica allocates
tens of thousands of small objects a second (requests, futures, arrays, closures), so
full collections come often, and each walks the whole startup heap again. Ray Serve
freezes its replicas' startup heap for that reason (`RAY_SERVE_FREEZE_GC_ON_STARTUP`, at
the end of a replica's constructor: the ingress gets it from Serve); the batching actor and
the model replicas are plain Ray actors, where nothing else does it, so they call this once
ready. Measured (docs/performance.md): in one process without Serve
(`benchmarks.http.quick_path --no-freeze` against the default) the quick lane costs
less CPU per request frozen; in the actor setup (`benchmarks.serve.compare --models
sleep --concurrency 128 --paths http --setups actor --peers`, against
`RAYBATCH_FREEZE_HEAP=0`) the batching actor's CPU per request moved within the machine's
noise: what it buys there is fewer long collections (pauses), not throughput.

`freeze_startup_heap` collects once (what startup left as garbage is freed, not frozen),
then `gc.freeze()`s the rest: those objects move to a permanent generation the collector
never walks. Everything allocated afterwards is collected as before, cycles included;
frozen objects are still freed by reference counting when they are dropped, only a
frozen object in a reference cycle that dies later stays (it was alive at startup: rare).
`RAYBATCH_FREEZE_HEAP=0` in the environment Ray's workers start with turns it off (to
compare, or if a model's startup objects die in cycles and should be collected).
"""

from __future__ import annotations

import gc
import logging
import os
import time

log = logging.getLogger(__name__)
ENV = "RAYBATCH_FREEZE_HEAP"


def freeze_startup_heap(who: str) -> int:
    """Collect, then freeze every object alive now; returns how many are frozen (0 when
    `RAYBATCH_FREEZE_HEAP=0` turns it off)."""
    if os.environ.get(ENV, "1") == "0":
        return 0
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d startup objects frozen out of the garbage collector's walks (%.0f ms)",
             who, frozen, (time.perf_counter() - started) * 1e3)
    return frozen
