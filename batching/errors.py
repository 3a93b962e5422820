"""The exceptions Raybatch puts on request futures, in one small hierarchy.

Errors are raised (or set on a future), never returned as values. Each class
carries the HTTP status the ingress maps it to, so the mapping lives in one
place (`http_status`) instead of being re-derived at every edge.
"""

from __future__ import annotations

import pickle
import traceback

# How a full queue's message starts: Triton's words (`Exceeds maximum queue size`), so
# clients that look for them find them; Raybatch's hint follows.
QUEUE_FULL = "Exceeds maximum queue size"


class RaybatchError(Exception):
    """Base class of every error Raybatch raises on purpose."""

    http_status: int = 500


class InvalidRequest(RaybatchError, ValueError):
    """The request itself is malformed: fixing the request fixes it."""

    http_status = 400


class QueueFull(RaybatchError):
    """The queue of the request's priority level holds `max_queue_size` requests."""

    http_status = 429


class Overloaded(QueueFull):
    """The model cannot serve the request before its deadline at the rate it measurably
    drains its queue: refused at submit, or shed from the queue before it ran (nothing of
    it ran: safe to retry). `retry_after_s`: when the work ahead of it should have drained
    enough (`batching.dynamic.admission`)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # pickled with its hint (errors cross Ray calls)
        return type(self), (str(self), self.retry_after_s)


class DeadlineExceeded(RaybatchError, TimeoutError):
    """The request's deadline passed before it could be run; it never reached a model."""

    http_status = 504


class NoAnswerInTime(DeadlineExceeded):
    """The request's deadline passed while it was out for its answer (its batch on a
    replica, its bundle at a batching actor), and none came by then: what ran it is slow,
    hung or cut off. Unlike its parent's, this request may have run."""

    http_status = 504


class Cancelled(RaybatchError):
    """The request was cancelled by its caller before it finished."""

    http_status = 499


class ServiceClosed(RaybatchError):
    """The service stopped before the request could run."""

    http_status = 503


class Draining(ServiceClosed):
    """Refused at once because the service is draining (a redeploy or delete): nothing of
    the request ran, so it is safe to send again (to the new deployment)."""

    http_status = 503


class WorkerDied(RaybatchError):
    """The process or actor running the model died with this request in flight."""

    http_status = 503


class BatchTimedOut(WorkerDied):
    """The model did not finish the request's batch within the replica's
    `batch_timeout_s`: the replica was taken for hung, stopped and replaced."""

    http_status = 504


class BatchSizeMismatch(RaybatchError):
    """A model returned a different number of results than the batch had items."""

    http_status = 500


class UnknownSequence(InvalidRequest):
    """A sequence request without `sequence_start` names a sequence that is not live
    (never started, ended, or freed after being idle), or a start names one that is."""

    http_status = 400


class SequenceLost(RaybatchError):
    """The replica holding this sequence's state died: the state is gone, and the
    sequence must be started again (`sequence_start`)."""

    http_status = 410


class ModelError(RaybatchError):
    """The model raised while running a batch; only that batch's requests fail."""

    http_status = 500


def http_status(error: BaseException) -> int:
    """The HTTP status code for `error`: its class's, or 500 for anything unexpected."""
    return getattr(error, "http_status", 500)


def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling, else a ModelError that names it; with the traceback."""
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickle.loads(pickle.dumps(error))
        out = error
    except Exception:
        out = ModelError(f"model raised {type(error).__name__}: {error}")
    out.__traceback__ = None
    if hasattr(out, "add_note"):
        out.add_note(f"in the model worker:\n{tb}")
    return out
