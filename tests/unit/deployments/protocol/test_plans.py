"""Binary requests decoded from a remembered header (`deployments.protocol.plans`): the
same request, and the same errors, as the full parse gives."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import InvalidRequest
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    ModelSpec,
    RequestLimits,
    TensorSpec,
    parse_infer_request,
)
from deployments.protocol import plans as plans_module
from tests.unit.deployments.protocol.oip_cases import ALL, IDS, X, triton_body

LIMITS = RequestLimits(max_body_bytes=1 << 20)


def spec() -> ModelSpec:  # a fresh one per test: plans live on the spec
    return ModelSpec("m", inputs=[TensorSpec("x", "FP32", [-1, 3]),
                                  TensorSpec("ids", "INT32", [-1])],
                     outputs=[TensorSpec("y", "FP32", [-1, 3])], max_batch_size=8)


def parse(body, headers, s, limits=LIMITS, remember=True):
    return parse_infer_request(body, headers, s, limits, remember=remember)


def same(a, b) -> None:
    assert (a.id, a.parameters, a.outputs_requested, a.batch_size) == (
        b.id, b.parameters, b.outputs_requested, b.batch_size)
    assert list(a.inputs) == list(b.inputs)
    for name in a.inputs:
        assert a.inputs[name].dtype == b.inputs[name].dtype
        np.testing.assert_array_equal(a.inputs[name], b.inputs[name])


def test_a_header_seen_before_decodes_the_new_bytes_as_the_full_parse_does():
    s = spec()
    body, headers = triton_body({"x": X, "ids": IDS}, request_id="r1", priority=2,
                                outputs=None)
    first = parse(body, headers, s)
    assert len(s.plans) == 1
    other = {"x": X + 1, "ids": IDS * 3}
    body2, headers2 = triton_body(other, request_id="r1", priority=2)
    assert body2[:int(headers2[INFER_HEADER_LENGTH])] == body[:int(headers[INFER_HEADER_LENGTH])]
    planned = parse(body2, headers2, s)
    same(planned, parse(body2, headers2, spec(), remember=False))
    np.testing.assert_array_equal(planned.inputs["x"], X + 1)
    assert planned.inputs["x"].base is not None and not planned.inputs["x"].flags.writeable
    same(first, parse(body, headers, spec(), remember=False))
    planned.parameters["priority"] = 9  # each request its own dicts and lists
    assert parse(body2, headers2, s).parameters["priority"] == 2


def test_a_different_binary_length_takes_the_full_parse_and_its_error():
    s = spec()
    body, headers = triton_body({"x": X, "ids": IDS})
    parse(body, headers, s)
    for cut in (body[:-1], body + b"\0"):
        with pytest.raises(InvalidRequest) as planned:
            parse(cut, headers, s)
        with pytest.raises(InvalidRequest) as full:
            parse(cut, headers, spec(), remember=False)
        assert str(planned.value) == str(full.value)


def test_other_limits_take_the_full_parse():
    s = spec()
    body, headers = triton_body({"x": X, "ids": IDS})
    parse(body, headers, s)
    with pytest.raises(InvalidRequest, match="carries 2 items"):
        parse(body, headers, s, RequestLimits(max_body_bytes=1 << 20, max_items=1))


def test_bytes_and_json_inputs_are_not_remembered():
    s = ModelSpec("m", inputs=[TensorSpec("x", "FP32", [-1, 3]),
                               TensorSpec("ids", "INT32", [-1]),
                               TensorSpec("text", "BYTES", [-1, 2])],
                  outputs=[TensorSpec("y", "FP32", [-1, 3])], max_batch_size=8)
    parse(*triton_body(ALL), s)  # BYTES: its elements' lengths are in the binary part
    parse(*triton_body(ALL, {"x": True, "ids": False, "text": True}), s)
    s2 = spec()
    parse(*triton_body({"x": X, "ids": IDS}, {"x": True, "ids": False}), s2)
    assert not s.plans and not s2.plans


def test_without_remember_nothing_is_kept_and_the_plans_are_bounded(monkeypatch):
    s = spec()
    parse(*triton_body({"x": X, "ids": IDS}), s, remember=False)
    assert not s.plans
    monkeypatch.setattr(plans_module, "MAX_PLANS", 2)
    for i in range(3):
        parse(*triton_body({"x": X, "ids": IDS}, request_id=f"r{i}"), s)
    assert len(s.plans) == 1  # forgotten at once when full, then the new one kept
