"""Where sequences live: each replica's slots, the starts waiting for one, the lost ids.

The sequence batcher asks this table which sequence a request joins (and gets
the error when it joins none), opens a sequence on a start, and frees it when
it ends. A start takes the lowest free slot of the replica with the most free
slots (ties: the first added); with none free it waits, FIFO, in `pending`,
bounded by `max_pending_sequences`. A replica that goes away takes the state of
its started sequences with it: they are remembered as lost (bounded), so a
later request names the real cause; a sequence whose start had not run yet lost
nothing and waits for a slot again.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Hashable

from batching.errors import QUEUE_FULL, QueueFull, SequenceLost, UnknownSequence
from batching.sequence.state import Phase, Replica, Seq
from batching.sequence.types import SequenceId, SequenceRequest

_MAX_LOST_REMEMBERED = 65536  # lost ids answered with SequenceLost rather than UnknownSequence


def lost_error(sid: SequenceId) -> SequenceLost:
    return SequenceLost(
        f"sequence {sid!r} was lost: the replica holding it died and its state is gone; "
        "start it again with sequence_start"
    )


class SlotTable:
    """The live and pending sequences of a batcher, and which replica slot each holds."""

    def __init__(self, per_replica: int, max_pending: int | None, idle_s: float) -> None:
        self.per_replica = per_replica
        self.max_pending = max_pending
        self.idle_s = idle_s  # only for messages
        self.replicas: dict[Hashable, Replica] = {}
        self.seqs: dict[SequenceId, Seq] = {}
        self.pending: list[Seq] = []  # starts waiting for a slot, FIFO
        self.lost: OrderedDict[SequenceId, None] = OrderedDict()
        self.releases: defaultdict[Hashable, list[SequenceId]] = defaultdict(list)

    @property
    def live(self) -> int:
        return sum(len(r.slots) - r.free for r in self.replicas.values())

    def add_replica(self, key: Hashable) -> None:
        if key in self.replicas:
            raise ValueError(f"replica {key!r} was already added")
        self.replicas[key] = Replica(key, [None] * self.per_replica, free=self.per_replica)

    def remove_replica(self, key: Hashable) -> list[Seq]:
        """Forget `key`; returns its started sequences, now ENDED and remembered as lost."""
        rep = self.replicas.pop(key)
        self.releases.pop(key, None)  # nothing to tell a replica that is gone
        lost, unstarted = [], []
        for seq in rep.slots:
            if seq is not None and seq.started:
                lost.append(seq)
                self.lose(seq)
            elif seq is not None:
                seq.phase, seq.replica, seq.slot = Phase.PENDING, None, -1
                unstarted.append(seq)
        self.pending[:0] = unstarted  # they were admitted before any start still waiting
        return lost

    def lose(self, seq: Seq) -> None:
        """`seq`'s state is gone: free it, and answer its id with SequenceLost from now on."""
        rep = self.replicas.get(seq.replica)
        if seq.phase is Phase.LIVE and rep is not None:
            rep.vacate(seq)
        self._forget(seq)
        if not seq.closing:  # an ending sequence is not named again
            self.lost[seq.id] = None
            while len(self.lost) > _MAX_LOST_REMEMBERED:
                self.lost.popitem(last=False)

    def sequence_for(self, request: SequenceRequest) -> Seq:
        """The sequence `request` joins (a new, pending one for a start), or the error."""
        sid, seq = request.sequence_id, self.seqs.get(request.sequence_id)
        if request.start:
            if seq is not None:
                raise UnknownSequence(
                    f"sequence {sid!r} is already live: end it (sequence_end) before starting "
                    "it again, or use another sequence_id"
                )
            return self._open(sid)
        if seq is None and sid in self.lost:
            if request.end:
                del self.lost[sid]
            raise lost_error(sid)
        if seq is None:
            raise UnknownSequence(
                f"sequence {sid!r} is not live: it was never started, has ended, or was freed "
                f"after {self.idle_s} s idle; send sequence_start on its first request"
            )
        if seq.closing:
            raise UnknownSequence(
                f"sequence {sid!r} has ended: its sequence_end request was already sent; "
                "start it again with sequence_start"
            )
        return seq

    def admit(self, now: float) -> list[Seq]:
        """Give waiting starts the free slots, FIFO; returns the sequences placed."""
        placed = []
        while self.pending and (rep := self._roomiest()) is not None:
            seq = self.pending.pop(0)
            rep.place(seq, now)
            placed.append(seq)
        return placed

    def end(self, seq: Seq, *, release: bool) -> None:
        """Free the slot of `seq`; with `release`, its replica is told to drop its state."""
        if seq.phase is Phase.LIVE:
            self.replicas[seq.replica].vacate(seq)
            if release and seq.started:
                self.releases[seq.replica].append(seq.id)
        elif seq.phase is Phase.PENDING:
            self.pending.remove(seq)
        self._forget(seq)

    def _forget(self, seq: Seq) -> None:
        seq.phase, seq.idle_at = Phase.ENDED, None
        del self.seqs[seq.id]

    def _open(self, sid: SequenceId) -> Seq:
        limit = self.max_pending
        waits = self._roomiest() is None or bool(self.pending)
        if waits and limit is not None and len(self.pending) >= limit:
            raise QueueFull(
                f"{QUEUE_FULL}: {len(self.pending)} sequence starts already wait for a free slot "
                f"(max_pending_sequences={limit}): retry later, end idle sequences or add "
                "replicas"
            )
        seq = self.seqs[sid] = Seq(sid)
        self.lost.pop(sid, None)
        self.pending.append(seq)
        return seq

    def _roomiest(self) -> Replica | None:
        return max((r for r in self.replicas.values() if r.free), key=lambda r: r.free,
                   default=None)
