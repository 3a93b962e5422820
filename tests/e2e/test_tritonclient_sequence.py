"""Triton's `tritonclient.http`, unchanged, driving stateful sequences (int and string ids)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(front_url):  # through Serve's proxy, and the fast path
    c = httpclient.InferenceServerClient(front_url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def step(client, value: int, **controls) -> int:
    tensor = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32), binary_data=True)
    out = client.infer("accumulator", [tensor], **controls)
    return int(out.as_numpy("OUTPUT0")[0][0])


@pytest.mark.parametrize("sequence_id", [4242, "triton-seq"])
def test_simple_sequence_like_tritons_example(client, sequence_id):
    values = [11, 7, 5, 3, 2, 0, 1]
    sums = []
    for i, v in enumerate(values):
        sums.append(step(client, v, sequence_id=sequence_id, sequence_start=i == 0,
                         sequence_end=i == len(values) - 1))
    assert sums == list(np.cumsum(values))


def test_two_interleaved_sequences_keep_their_own_state(client):
    a = step(client, 1, sequence_id=5001, sequence_start=True)
    b = step(client, 100, sequence_id="other", sequence_start=True)
    a = step(client, 2, sequence_id=5001)
    b = step(client, 200, sequence_id="other", sequence_end=True)
    a = step(client, 3, sequence_id=5001, sequence_end=True)
    assert (a, b) == (6, 300)


def test_a_request_of_an_unknown_sequence_is_a_clear_error(client):
    with pytest.raises(InferenceServerException, match="sequence_start") as e:
        step(client, 1, sequence_id=999_999)
    assert e.value.status() == "400"
