"""The demo models shipped with Raybatch: built in code or from an offline package, never
downloaded. Configs name them as `deployments.models:<Class>`.

    simple.py     Square (y = x²), Sleep (a known cost: a + b·items seconds), MLP (a seeded
                  torch MLP 256→1024→256); set_torch_threads
    minilm.py     MiniLM: sentence embeddings (all-MiniLM-L6-v2, the offline wheel)
    stateful.py   Accumulator (Triton's simple_sequence) and GRU: stateful, sequence batching
    triton_examples.py  Simple, SimpleString, Identity, SimpleSequence: Triton's example
                  models (`configs/triton-examples.yaml`)
    tinylm.py     TinyLM: a tiny decoder trained at start on tinylm_corpus.txt, for
                  continuous batching (generate / generate_stream)
    twotower.py   TwoTower: a seeded two-tower scorer with 2 inputs and 3 outputs (one of
                  them BYTES), the multi-tensor demo
"""

from deployments.models.minilm import MiniLM
from deployments.models.simple import MLP, Sleep, Square, set_torch_threads
from deployments.models.stateful import GRU, Accumulator
from deployments.models.tinylm import TinyLM
from deployments.models.triton_examples import Identity, Simple, SimpleSequence, SimpleString
from deployments.models.twotower import TwoTower

__all__ = ["GRU", "MLP", "Accumulator", "Identity", "MiniLM", "Simple", "SimpleSequence",
           "SimpleString", "Sleep", "Square", "TinyLM", "TwoTower", "set_torch_threads"]
