"""Replica actors of stateful and generative models: per-sequence state lives here.

A `SequenceReplica` keeps the states of the sequences the batching actor gave
it (a `StateStore`: created on start, replaced by what the model returns,
dropped on end or when the batcher says a sequence idled out). A
`StepReplica` keeps the generations it runs (a `Generator`) and advances all
of them one step per call. Both are sync actors, one batch or step at a time,
built and placed like `ModelReplica` (whose constructor builds the model); if
one dies, its state is gone, and the batcher says so to the sequences it held.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from batching.iterative.generative import Generator
from batching.iterative.scheduler import Join, StepOutput
from batching.sequence.stateful import SequenceBatchInput, StateStore
from deployments.replica.actor import ModelReplica


class SequenceReplica(ModelReplica):
    DEVICE_THREAD = False  # Ray's one thread: calls change state in the order sent

    def __init__(self, model_json: str, index: int, record_metrics: bool = False,
                 in_process: bool = False) -> None:
        super().__init__(model_json, index, record_metrics, in_process)
        self.store = StateStore(self.model)

    def run(self, batch: SequenceBatchInput) -> tuple[list[Any], float]:  # type: ignore[override]
        t0 = time.perf_counter()
        results = self.store.run(batch)
        return results, self._elapsed(t0)

    def release(self, sequence_ids: list[Any]) -> int:
        return self.store.release(sequence_ids)

    def live_sequences(self) -> int:
        return self.store.live


class StepReplica(ModelReplica):
    DEVICE_THREAD = False  # Ray's one thread: calls change state in the order sent

    def __init__(self, model_json: str, index: int, record_metrics: bool = False,
                 in_process: bool = False) -> None:
        super().__init__(model_json, index, record_metrics, in_process)
        self.generator = Generator(self.model)

    def step(self, join: Sequence[Join], leave: Sequence[Any]) -> tuple[list[StepOutput], float]:
        t0 = time.perf_counter()
        outputs = self.generator.step(join, leave)
        return outputs, self._elapsed(t0)
