"""The simulator: the real batching engine driven by a virtual clock.

Predicts throughput and latency of a policy before deploying it, and studies
scales this machine cannot hold.

    arrivals.py   arrival processes: Poisson, Bursts, Trace (a recorded file), ClosedLoop
    engine.py     simulate(policy, arrivals, ...): DynamicBatcher + Ledger against replicas
                  whose batches take a + b·cost seconds
    report.py     SimReport: throughput, latency quantiles, batch sizes, flush reasons
    sizing.py     sweep candidates (policy, replicas, deadline) over loads; pick the cheapest
                  that meets a p99 target
    cli.py        `raybatch simulate` / `python -m batching.simulate`

    >>> from batching import DynamicPolicy
    >>> from batching.simulate import Poisson, simulate
    >>> r = simulate(DynamicPolicy(max_batch_size=8), Poisson(100.0), duration_s=1.0,
    ...              latency_a_s=0.002, latency_b_s=0.00005)
    >>> r.completed > 0
    True
"""

from batching.simulate.arrivals import Arrivals, Bursts, ClosedLoop, Poisson, Trace
from batching.simulate.engine import simulate
from batching.simulate.report import SimReport, histogram, latency_summary_ms
from batching.simulate.sizing import Candidate, Point, cheapest, curve, sweep

__all__ = ["Arrivals", "Bursts", "Candidate", "ClosedLoop", "Point", "Poisson", "SimReport",
           "Trace", "cheapest", "curve", "histogram", "latency_summary_ms", "simulate", "sweep"]
