"""The one error writer: `{"error": str}` for everything, the right status and headers,
nothing internal in the body, one log line per client error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from batching.errors import (
    DeadlineExceeded,
    InvalidRequest,
    ModelError,
    Overloaded,
    QueueFull,
    SequenceLost,
    WorkerDied,
    portable,
)
from deployments.http.oip.errors import (
    MethodNotAllowed,
    NoRoute,
    TooManyStreams,
    Unavailable,
    UnknownModel,
    error_parts,
    log_error,
)


def parts(exc):
    status, body, headers = error_parts(exc)
    doc = json.loads(body)
    assert set(doc) == {"error"} and isinstance(doc["error"], str)
    return status, doc["error"], dict(headers)


@pytest.mark.parametrize(("exc", "status"), [
    (InvalidRequest("bad"), 400), (UnknownModel("nope"), 404), (NoRoute("no"), 404),
    (SequenceLost("gone"), 410), (QueueFull("full"), 429), (TooManyStreams("many"), 429),
    (ModelError("model broke"), 500), (WorkerDied("died"), 503), (Unavailable("busy"), 503),
    (DeadlineExceeded("late"), 504),
])
def test_each_error_class_has_its_status_and_says_its_message(exc, status):
    got_status, message, headers = parts(exc)
    assert got_status == status and message == str(exc)
    assert headers[b"content-type"] == b"application/json"
    assert (b"retry-after" in headers) == (status in (429, 503))


def test_405_names_the_allowed_methods_in_allow():
    status, _, headers = parts(MethodNotAllowed("no", ("GET", "POST"), "/x"))
    assert status == 405 and headers[b"allow"] == b"GET, POST"


def test_an_unexpected_error_says_its_type_and_nothing_else():
    try:
        Path("/opt/secret/internal/path.txt").read_text()
    except OSError as e:
        status, message, _ = parts(e)
    assert status == 500
    assert message == "internal server error (FileNotFoundError); the server log has the details"


def test_a_model_error_says_the_models_one_line_message_not_its_traceback():
    def model():
        raise ValueError("weights are NaN\nsecond line")

    try:
        model()
    except ValueError as e:
        error = portable(e)  # what the replica sends back: the traceback in a note
    status, message, _ = parts(error)
    assert status == 500 and message == "the model raised ValueError: weights are NaN"
    assert "Traceback" not in message and "File " not in message


def test_messages_are_bounded():
    _, message, _ = parts(InvalidRequest("x" * 10_000))
    assert len(message) == 2_000


def test_a_client_error_logs_one_line(caplog):
    caplog.set_level(logging.INFO, logger="deployments.http")
    log_error(InvalidRequest("bad shape\nand more"), 400, "POST", "/v2/models/m/infer\nX")
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert "\n" not in record.getMessage()


def test_a_server_bug_logs_its_traceback(caplog):
    try:
        {}["missing"]
    except KeyError as e:
        log_error(e, 500, "GET", "/v2")
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None


@pytest.mark.parametrize(("hint", "header"), [(None, b"1"), (0.2, b"1"), (2.5, b"3")])
def test_retry_after_is_the_engines_hint_in_whole_seconds(hint, header):
    status, _, headers = parts(Overloaded("the model is overloaded", retry_after_s=hint))
    assert status == 429 and headers[b"retry-after"] == header
