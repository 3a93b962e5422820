"""Sequence batching, for stateful models (Triton's sequence batcher).

Every request names a sequence (correlation id, start / end controls); a
sequence lives on one replica, in one slot, until it ends or idles out.

    policy.py     SequencePolicy: strategy direct | oldest, slots, idle timeout
    types.py      SequenceRequest, SequenceBatch, the values the engine passes around
    state.py      one sequence's and one replica's bookkeeping
    slots.py      direct strategy: one slot per live sequence, sticky replica and slot
    rows.py       oldest strategy: dynamic-batching rules over the oldest ready sequences
    batcher.py    SequenceBatcher: the state machine, handed `now`
    host.py       SequenceHost: the asyncio loop around it
    stateful.py   StatefulTransformer (the model interface: implicit state in and out)
                  and StateStore (the replica side: per-sequence state, committed per batch)
"""

from batching.sequence.batcher import SequenceBatcher
from batching.sequence.host import SequenceHost
from batching.sequence.policy import SequencePolicy, SequenceStrategy
from batching.sequence.stateful import SequenceBatchInput, StatefulTransformer, StateStore
from batching.sequence.types import SequenceBatch, SequenceId, SequenceRequest

__all__ = ["SequenceBatch", "SequenceBatchInput", "SequenceBatcher", "SequenceHost",
           "SequenceId", "SequencePolicy", "SequenceRequest", "SequenceStrategy",
           "StateStore", "StatefulTransformer"]
