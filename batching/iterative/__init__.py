"""Iterative (continuous) batching, for generative models (vLLM's scheduler, on Ray).

Each step runs one iteration for every active sequence; sequences join and
leave at step boundaries.

    policy.py      IterativePolicy: max_active, the token budget per step, limits
    scheduler.py   IterativeScheduler: who joins, who leaves, each step (handed `now`);
                   a lockstep mode as the @serve.batch baseline
    generative.py  StepModel (the model interface: prefill / step / encode / decode, and
                   step_logits to sample) and Generator (the replica side: per-sequence
                   state, stop strings, eos)
    sampling.py    temperature / top_p / seed: the checks, one RNG per sequence, the draw
    host.py        IterativeHost: the asyncio loop, streaming each step's tokens
    meter.py       StepMeter: what the host measures of its steps, for metrics
"""

from batching.iterative.generative import Generator, StepModel
from batching.iterative.host import IterativeHost
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest, IterativeScheduler

__all__ = ["GenerateRequest", "Generator", "IterativeHost", "IterativePolicy",
           "IterativeScheduler", "StepModel"]
