"""SequenceBatcher as a state machine: one line per instant, no clock, no host.

Replicas are plain strings; `free` says how many batches each may take now.
"""

from __future__ import annotations

import pytest

from batching import DeadlineExceeded, InvalidRequest, QueueFull, SequenceLost, UnknownSequence
from batching.sequence.batcher import SequenceBatcher, SequenceRequest
from batching.sequence.policy import SequencePolicy
from batching.types import FlushReason

A = {"A": 1}
AB = {"A": 2, "B": 2}


def r(rid, sid, x=0, *, start=False, end=False, timeout_s=None) -> SequenceRequest:
    return SequenceRequest(rid, sid, x, start, end, timeout_s)


def batcher(*replicas: str, **policy) -> SequenceBatcher:
    q = SequenceBatcher(SequencePolicy(**policy))
    for key in replicas or ("A",):
        q.add_replica(key)
    return q


def rows(batch) -> list[tuple]:
    """(request id, sequence id, start, end) per ready row; None for a row that is not."""
    return [(rid, sid, s, e) if ok else None for rid, sid, s, e, ok in
            zip(batch.request_ids, batch.sequence_ids, batch.start, batch.end, batch.ready)]


def failures(q) -> dict:
    return {f.request_id: type(f.error) for f in q.take_failures()}


# -- direct ---------------------------------------------------------------------------------
def test_direct_rows_are_the_slots_up_to_the_highest_ready_one():
    q = batcher(max_batch_size=4)
    for i, sid in enumerate((10, 11, 12)):
        q.submit(r(f"s{i}", sid, start=True), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    assert (b.replica, b.slots, b.reason) == ("A", (0, 1, 2), FlushReason.DELAY)
    assert rows(b) == [("s0", 10, True, False), ("s1", 11, True, False), ("s2", 12, True, False)]
    q.complete(b.id, now=0.1)
    q.submit(r("x", 12, end=True), now=0.2)
    b = q.next_batch(now=0.2, free=A)
    assert rows(b) == [None, None, ("x", 12, False, True)] and b.slots == (0, 1, 2)
    assert (b.request_ids, b.sequence_ids, b.ready) == (
        (None, None, "x"), (None, None, 12), (False, False, True))
    q.complete(b.id, now=0.3)
    assert q.live_sequences == 2 and q.take_releases() == {}  # the end dropped its own state


def test_a_sequences_next_request_waits_until_its_previous_one_completed():
    q = batcher(max_batch_size=2)
    q.submit(r("a", 1, start=True), now=0.0)
    q.submit(r("b", 1), now=0.0)
    assert rows(q.next_batch(now=0.0, free={"A": 2})) == [("a", 1, True, False)]
    assert q.next_batch(now=0.0, free={"A": 1}) is None  # "b" is queued, never beside "a"
    assert q.queued_requests == 1 and q.deadline() is None
    q.complete(0, now=0.5)
    assert rows(q.next_batch(now=0.5, free=A)) == [("b", 1, False, False)]


def test_a_start_takes_the_replica_with_most_free_slots_ties_to_the_first_added():
    q = batcher("A", "B", max_batch_size=2)
    for sid in (1, 2, 3, 4):
        q.submit(r(f"s{sid}", sid, start=True), now=0.0)
    a, b = q.next_batch(now=0.0, free=AB), q.next_batch(now=0.0, free=AB)
    assert (a.replica, a.sequence_ids) == ("A", (1, 3))  # 1 → A (tie), 2 → B, 3 → A (tie)
    assert (b.replica, b.sequence_ids) == ("B", (2, 4))
    assert q.live_sequences == 4 and q.next_batch(now=0.0, free=AB) is None


def test_every_request_of_a_sequence_goes_to_its_replica_and_slot():
    q = batcher("A", "B", max_batch_size=2)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.0)
    for step in range(3):
        q.submit(r(f"t{step}", 2), now=0.0)
    seen = []
    while (b := q.next_batch(now=0.0, free=AB)) is not None:
        seen.append((b.replica, rows(b)))
        q.complete(b.id, now=0.0)
    assert seen == [("A", [("s1", 1, True, False)]), ("B", [("s2", 2, True, False)]),
                    ("B", [("t0", 2, False, False)]), ("B", [("t1", 2, False, False)]),
                    ("B", [("t2", 2, False, False)])]


def test_a_start_waits_fifo_for_a_free_slot_and_takes_the_one_an_end_frees():
    q = batcher(max_batch_size=1)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.1)
    q.submit(r("s3", 3, start=True), now=0.2)
    assert (q.live_sequences, q.pending_sequences) == (1, 2)
    b = q.next_batch(now=0.2, free=A)
    assert b.sequence_ids == (1,) and q.next_batch(now=0.2, free=A) is None
    q.complete(b.id, now=0.3)
    q.submit(r("e1", 1, end=True), now=0.4)
    q.complete(q.next_batch(now=0.4, free=A).id, now=0.5)  # 1 ends: 2 gets slot 0, not 3
    b = q.next_batch(now=0.5, free=A)
    assert rows(b) == [("s2", 2, True, False)] and q.pending_sequences == 1


def test_max_pending_sequences_refuses_one_more_waiting_start_with_queue_full():
    q = batcher(max_batch_size=1, max_pending_sequences=1)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.0)
    with pytest.raises(QueueFull, match=r"1 sequence starts already wait.*max_pending_sequences=1"):
        q.submit(r("s3", 3, start=True), now=0.0)
    assert (q.queued_requests, q.pending_sequences) == (2, 1)
    with pytest.raises(UnknownSequence):  # s3 was kept nowhere: it is not a sequence
        q.submit(r("x", 3), now=0.0)


def test_bad_controls_raise_at_once_and_leave_the_batch_untouched():
    q = batcher(max_batch_size=4)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", "two", start=True), now=0.0)
    q.submit(r("e3", 3, start=True, end=True), now=0.0)
    cases = [
        (r("u", 99), UnknownSequence, "sequence 99 is not live: it was never started"),
        (r("d", 1, start=True), UnknownSequence, "sequence 1 is already live: end it"),
        (r("z", 0, start=True), InvalidRequest, "sequence_id=0 is not a correlation id"),
        (r("y", "", start=True), InvalidRequest, "sequence_id='' is not a correlation id"),
        (r("w", True, start=True), InvalidRequest, "sequence_id=True is not"),
        (r("v", 2.5, start=True), InvalidRequest, "sequence_id=2.5 is not"),
        (r("t", 1, timeout_s=0), InvalidRequest, "timeout_s=0 must be > 0"),
        (r("s1", 1), InvalidRequest, "request id 's1' is already queued"),
        (r("after-end", 3), UnknownSequence, "sequence 3 has ended: its sequence_end request"),
        (r("restart", 3, start=True), UnknownSequence, "sequence 3 is already live"),
    ]
    for request, error, message in cases:
        with pytest.raises(error, match=message):
            q.submit(request, now=0.0)
    assert q.queued_requests == 3 and q.live_sequences == 3
    b = q.next_batch(now=0.0, free=A)
    assert rows(b) == [("s1", 1, True, False), ("s2", "two", True, False),
                       ("e3", 3, True, True)]
    q.complete(b.id, now=0.0)
    with pytest.raises(UnknownSequence, match="sequence 3 is not live"):  # ended for good
        q.submit(r("again", 3), now=0.0)
    assert q.take_failures() == [] and q.live_sequences == 2


def test_int_and_str_correlation_ids_name_different_sequences():
    q = batcher(max_batch_size=4)
    q.submit(r("i", 7, start=True), now=0.0)
    q.submit(r("s", "7", start=True), now=0.0)
    q.complete(q.next_batch(now=0.0, free=A).id, now=0.0)
    q.submit(r("i2", 7, end=True), now=0.0)
    q.submit(r("s2", "7"), now=0.0)
    assert rows(q.next_batch(now=0.0, free=A)) == [("i2", 7, False, True),
                                                    ("s2", "7", False, False)]


def test_direct_waits_up_to_the_delay_for_more_ready_slots_unless_all_are_ready():
    q = batcher(max_batch_size=2, max_queue_delay_s=0.5)
    q.submit(r("a", 1, start=True), now=0.0)
    assert q.next_batch(now=0.4, free=A) is None and q.deadline() == 0.5
    assert q.next_batch(now=0.5, free=A).reason is FlushReason.DELAY
    q.complete(0, now=1.0)
    q.submit(r("b", 1), now=1.0)
    q.submit(r("c", 2, start=True), now=1.1)
    assert q.next_batch(now=1.1, free=A).reason is FlushReason.FULL  # both slots ready


def test_a_replica_without_a_free_batch_place_gets_nothing_and_sets_no_timer():
    q = batcher(max_batch_size=2, max_queue_delay_s=0.5)
    q.submit(r("a", 1, start=True), now=0.0)
    assert q.next_batch(now=1.0, free={"A": 0}) is None
    assert q.deadline() is None  # a completion, not the clock, unblocks it
    assert q.next_batch(now=1.0, free=A).request_ids == ("a",)


# -- oldest ---------------------------------------------------------------------------------
def test_oldest_batches_the_oldest_ready_heads_one_per_sequence():
    q = batcher(strategy="oldest", max_batch_size=2, max_candidate_sequences=4)
    for i, sid in enumerate((5, 6, 7, 8)):
        q.submit(r(f"s{sid}", sid, start=True), now=0.1 * i)
    q.submit(r("t5", 5), now=0.5)
    b1 = q.next_batch(now=0.5, free={"A": 2})
    b2 = q.next_batch(now=0.5, free={"A": 1})
    assert (b1.sequence_ids, b1.slots, b1.ready, b1.reason) == (
        (5, 6), (0, 1), (True, True), FlushReason.FULL)
    assert (b2.sequence_ids, b2.slots) == ((7, 8), (2, 3))
    q.complete(b2.id, now=0.6)  # 7 and 8 are ready again only with a new request
    q.submit(r("t8", 8), now=0.6)
    q.submit(r("t7", 7), now=0.7)
    q.complete(b1.id, now=0.8)  # t5 became ready at 0.8, after t8 (0.6) and t7 (0.7)
    assert q.next_batch(now=0.8, free=A).request_ids == ("t8", "t7")
    assert q.next_batch(now=0.8, free=A).request_ids == ("t5",)


def test_oldest_waits_for_a_preferred_size_until_the_delay_then_sends_what_fits():
    q = batcher(strategy="oldest", max_batch_size=4, max_candidate_sequences=8,
                preferred_batch_sizes=(3,), max_queue_delay_s=1.0)
    q.submit(r("a", 1, start=True), now=0.0)
    q.submit(r("b", 2, start=True), now=0.2)
    assert q.next_batch(now=0.9, free=A) is None and q.deadline() == 1.0
    b = q.next_batch(now=1.0, free=A)
    assert (b.request_ids, b.reason) == (("a", "b"), FlushReason.DELAY)
    for sid in (3, 4, 5):
        q.submit(r(f"s{sid}", sid, start=True), now=2.0)
    b = q.next_batch(now=2.0, free=A)
    assert (b.request_ids, b.reason) == (("s3", "s4", "s5"), FlushReason.PREFERRED)


def test_oldest_sends_early_when_a_ready_request_would_expire_within_the_delay():
    q = batcher(strategy="oldest", max_batch_size=4, max_queue_delay_s=1.0)
    q.submit(r("a", 1, start=True, timeout_s=0.5), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    assert (b.request_ids, b.reason) == (("a",), FlushReason.DEADLINE)


def test_oldest_keeps_max_candidate_sequences_live_per_replica():
    q = batcher(strategy="oldest", max_batch_size=1, max_candidate_sequences=2)
    for sid in (1, 2, 3):
        q.submit(r(f"s{sid}", sid, start=True), now=0.0)
    assert (q.live_sequences, q.pending_sequences) == (2, 1)


# -- idle timeout -----------------------------------------------------------------------------
def test_an_idle_sequence_is_freed_its_state_released_and_a_waiting_start_gets_the_slot():
    q = batcher(max_batch_size=1, max_sequence_idle_s=1.0)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.complete(q.next_batch(now=0.0, free=A).id, now=0.25)
    q.submit(r("s2", 2, start=True), now=0.5)  # waits: the only slot is 1's
    assert q.deadline() == 1.25
    assert q.next_batch(now=1.0, free=A) is None and q.live_sequences == 1
    b = q.next_batch(now=1.25, free=A)
    assert rows(b) == [("s2", 2, True, False)]
    assert q.take_releases() == {"A": [1]} and q.take_releases() == {}
    assert q.stats["sequences_idle_freed"] == 1
    with pytest.raises(UnknownSequence, match=r"freed after 1\.0 s idle"):
        q.submit(r("late", 1), now=1.5)


def test_a_sequence_with_a_request_queued_or_running_is_not_idle():
    q = batcher(max_batch_size=2, max_sequence_idle_s=1.0)
    q.submit(r("s1", 1, start=True), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    assert q.next_batch(now=5.0, free=A) is None and q.live_sequences == 1  # running
    q.complete(b.id, now=5.0)
    q.submit(r("t", 1), now=5.9)
    assert q.next_batch(now=7.0, free={"A": 0}) is None  # queued, its replica busy
    assert q.live_sequences == 1 and q.take_releases() == {}
    q.complete(q.next_batch(now=7.0, free=A).id, now=7.0)
    assert q.deadline() == 8.0


# -- timeouts and cancellation ---------------------------------------------------------------
def test_an_expired_middle_request_fails_alone_and_the_sequence_goes_on():
    q = batcher(max_batch_size=1)
    q.submit(r("a", 1, start=True), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    q.submit(r("b", 1, timeout_s=0.5), now=0.0)
    q.submit(r("c", 1), now=0.0)
    assert q.deadline() == 0.5
    assert q.next_batch(now=0.5, free={"A": 0}) is None
    assert failures(q) == {"b": DeadlineExceeded}
    q.complete(b.id, now=1.0)
    assert q.next_batch(now=1.0, free=A).request_ids == ("c",)


def test_an_expired_start_never_starts_and_what_is_queued_behind_it_fails():
    q = batcher(max_batch_size=1)
    q.submit(r("a", 1, start=True), now=0.0)
    q.submit(r("b", 2, start=True, timeout_s=0.5), now=0.0)  # waits for the only slot
    q.submit(r("b2", 2), now=0.0)
    q.submit(r("c", 3, start=True), now=0.1)
    assert q.next_batch(now=0.5, free={"A": 0}) is None
    assert failures(q) == {"b": DeadlineExceeded, "b2": UnknownSequence}
    assert q.pending_sequences == 1  # only 3 waits now
    with pytest.raises(UnknownSequence, match="sequence 2 is not live"):
        q.submit(r("b3", 2), now=0.6)


def test_an_expired_end_still_ends_its_sequence_after_what_is_before_it_ran():
    q = batcher(max_batch_size=1)
    q.submit(r("a", 1, start=True), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    q.submit(r("e", 1, end=True, timeout_s=0.5), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.0)
    assert q.next_batch(now=0.5, free={"A": 0}) is None
    assert failures(q) == {"e": DeadlineExceeded} and q.live_sequences == 1
    with pytest.raises(UnknownSequence, match="has ended"):
        q.submit(r("more", 1), now=0.6)
    q.complete(b.id, now=1.0)  # "a" was the last: 1 ends, its state is released
    assert q.take_releases() == {"A": [1]}
    assert q.next_batch(now=1.0, free=A).sequence_ids == (2,)


def test_cancelling_frees_a_waiting_start_and_an_end_ends_the_sequence():
    q = batcher(max_batch_size=1)
    q.submit(r("a", 1, start=True), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    assert q.cancel("a", now=0.0) is False  # running: it is not withdrawn
    q.submit(r("s2", 2, start=True), now=0.0)
    q.submit(r("s3", 3, start=True), now=0.0)
    assert q.cancel("s2", now=0.1) is True and q.pending_sequences == 1
    q.complete(b.id, now=0.2)
    q.submit(r("e", 1, end=True), now=0.3)
    assert q.cancel("e", now=0.4) is True
    assert q.take_releases() == {"A": [1]} and q.take_failures() == []
    assert rows(q.next_batch(now=0.4, free=A)) == [("s3", 3, True, False)]
    assert q.cancel("e", now=0.5) is False and q.stats["cancelled"] == 2


def test_cancelling_the_only_queued_request_leaves_the_sequence_idle_not_ready():
    q = batcher(max_batch_size=2, max_sequence_idle_s=1.0)
    q.submit(r("a", 1, start=True), now=0.0)
    q.complete(q.next_batch(now=0.0, free=A).id, now=0.0)
    q.submit(r("b", 1), now=0.5)
    assert q.cancel("b", now=0.5) is True
    assert q.next_batch(now=0.5, free=A) is None and q.deadline() == 1.5
    q.submit(r("c", 1), now=0.6)
    assert q.next_batch(now=0.6, free=A).request_ids == ("c",)


# -- failures and lost replicas ----------------------------------------------------------------
def test_a_failed_batch_keeps_the_state_a_failed_start_or_end_ends_the_sequence():
    q = batcher(max_batch_size=4)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.0)
    q.complete(q.next_batch(now=0.0, free=A).id, now=0.0)
    q.submit(r("m", 1), now=0.0)
    q.submit(r("e", 2, end=True), now=0.0)
    q.submit(r("s3", 3, start=True), now=0.0)
    q.submit(r("s3b", 3), now=0.0)
    q.fail(q.next_batch(now=0.0, free=A).id, now=0.1)
    assert failures(q) == {"s3b": UnknownSequence}  # 3 never started
    assert q.take_releases() == {"A": [2, 3]}  # the replica may hold their state
    q.submit(r("m2", 1), now=0.2)  # 1 goes on
    assert q.next_batch(now=0.2, free=A).request_ids == ("m2",)
    assert q.live_sequences == 1


def test_a_removed_replica_loses_its_started_sequences_only():
    q = batcher("A", "B", max_batch_size=2)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.submit(r("s2", 2, start=True), now=0.0)
    ba = q.next_batch(now=0.0, free=AB)
    q.complete(q.next_batch(now=0.0, free=AB).id, now=0.0)
    q.submit(r("s3", 3, start=True), now=0.0)  # slotted on A, not started yet
    q.submit(r("q1", 1), now=0.0)
    assert q.remove_replica("A", now=0.1) == [1]
    assert failures(q) == {"q1": SequenceLost}
    b = q.next_batch(now=0.1, free=AB)  # 3 had no state yet: it moves to B's free slot 1
    assert (b.replica, b.sequence_ids, b.start) == ("B", (None, 3), (False, True))
    with pytest.raises(SequenceLost, match="the replica holding it died"):
        q.submit(r("q2", 1), now=0.2)
    q.complete(ba.id, now=0.3)  # the dead replica's batch returning changes nothing
    q.submit(r("fresh", 1, start=True), now=0.4)  # a start on a lost id starts anew
    assert q.live_sequences == 2 and q.pending_sequences == 1
    assert q.stats["sequences_lost"] == 1


def test_a_sequence_whose_replica_had_no_state_for_it_is_lost():
    q = batcher(max_batch_size=2)
    q.submit(r("s1", 1, start=True), now=0.0)
    q.complete(q.next_batch(now=0.0, free=A).id, now=0.0)
    q.submit(r("a", 1), now=0.0)
    b = q.next_batch(now=0.0, free=A)
    q.submit(r("b", 1), now=0.0)
    q.complete(b.id, now=0.1, lost=[1])
    assert failures(q) == {"b": SequenceLost} and q.live_sequences == 0


def test_drain_sends_at_once_and_stats_count_batches_by_size():
    q = batcher(strategy="oldest", max_batch_size=4, max_queue_delay_s=60.0)
    q.submit(r("a", 1, start=True), now=0.0)
    assert q.next_batch(now=0.0, free=A) is None
    q.drain()
    assert q.next_batch(now=0.0, free=A).reason is FlushReason.DRAIN
    s = q.stats
    assert (s["batches"], s["by_size"], s["by_reason"], s["sequences_started"]) == (
        1, {1: 1}, {"drain": 1}, 1)
    assert (s["live_sequences"], s["queued_requests"], s["inflight_batches"]) == (1, 0, 1)
