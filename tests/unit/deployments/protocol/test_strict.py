"""Hostile input to the codec: every answer a 400 (or 413) that says what was wrong,
never an exception of another kind (a 500), never invalid JSON out."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.errors import InvalidRequest
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    ModelSpec,
    PayloadTooLarge,
    RequestLimits,
    TensorSpec,
    check_content_length,
    encode_infer_response,
    jsondata,
    parse_generate_body,
)
from deployments.protocol.jsondata import decode_json_data
from tests.unit.deployments.protocol.oip_cases import json_request, parse

HOLE = '"@HOLE@"'
DIGITS_5000 = "9" * 5000
DEEP = "[" * 10_000 + "]" * 10_000
DEEP_1000 = "[" * 1000 + "]" * 1000  # within orjson's 1,024: it parses; repr() would not


def ids(data=None, **changes) -> dict:
    return {"name": "ids", "datatype": "INT32", "shape": [2],
            "data": [1, 2] if data is None else data, **changes}


def x(data) -> dict:
    return {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": data}


def fill(body: bytes, raw: str) -> bytes:
    """`body` with its one HOLE replaced by raw JSON text."""
    assert body.count(HOLE.encode()) == 1
    return body.replace(HOLE.encode(), raw.encode())


def refused(body: bytes, *words: str, headers: dict | None = None) -> str:
    with pytest.raises(InvalidRequest) as info:
        parse(body, headers)
    message = str(info.value)
    for w in words:
        assert w in message, message
    return message


# --- numbers JSON does not have ------------------------------------------------------


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999",
                                   DIGITS_5000, "-" + DIGITS_5000])
def test_non_finite_and_overflowing_numbers_are_refused(token):
    body = json_request(x=x("@HOLE@"))
    body = fill(body, f"[0, 1, 2, 3, 4, {token}]")
    refused(body, "not valid JSON", "no NaN or Infinity")


def test_a_number_outside_fp32_is_refused_not_made_infinite():
    refused(json_request(x=x([0, 1, 2, 3, 4, 1e39])), "1e+39, outside the range of FP32")
    body = json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 3],
                           "data": [0, 1, 2, 3, 4, -3.4e38]})
    assert parse(body).inputs["x"][1, 2] == np.float32(-3.4e38)


def test_fp16_range():
    spec = ModelSpec("h", inputs=[TensorSpec("h", "FP16", [-1])],
                     outputs=[TensorSpec("o", "FP16", [-1])], max_batch_size=4)
    doc = {"inputs": [{"name": "h", "datatype": "FP16", "shape": [2], "data": [1, 70000]}]}
    with pytest.raises(InvalidRequest, match="70000, outside the range of FP16"):
        parse(json.dumps(doc).encode(), spec=spec)
    # an integer past 64 bits (orjson reads it as a float) is named, not a fraction
    for data, words in (([2**64, 1], "holds 18446744073709551616, outside the range of UINT64"),
                        ([-(2**63) - 1], "holds -9223372036854775808, outside the range"),
                        ([-1, 2**63], "mixes negative integers with integers >= 2**63"),
                        ([1, 2.5], "needs integers in 'data', got fractions")):
        big = {"inputs": [{"name": "u", "datatype": "UINT64", "shape": [len(data)],
                           "data": data}]}
        big_spec = ModelSpec("u", inputs=[TensorSpec("u", "UINT64", [-1])],
                             outputs=[TensorSpec("o", "UINT64", [-1])], max_batch_size=4)
        with pytest.raises(InvalidRequest, match=re.escape(words)):
            parse(json.dumps(big).encode(), spec=big_spec)
    # int64's minimum: its np.abs is itself (negative), which once let it through as -inf
    doc["inputs"][0]["data"] = [-(2**63), 1]
    with pytest.raises(InvalidRequest, match="outside the range of FP16"):
        parse(json.dumps(doc).encode(), spec=spec)


@pytest.mark.parametrize(("entry", "words"), [
    (x([1.0, True, 0, 0, 0, 0]), "FP32 needs numbers in 'data', got true/false"),
    (ids([1, True]), "INT32 needs integers in 'data', got true/false"),
    (ids([1, 2.5]), "INT32 needs integers in 'data', got fractions"),
    (ids([1, None]), "got null"),
    (ids([1, {"a": 1}]), "got objects"),
    (ids([[1, "2"]], shape=[2]), "got strings"),
])
def test_values_of_another_kind_are_refused_even_beside_good_ones(entry, words):
    refused(json_request(ids=entry) if entry["name"] == "ids" else json_request(x=entry), words)


def test_a_large_uint64_stays_exact():
    spec = ModelSpec("u", inputs=[TensorSpec("u", "UINT64", [-1])],
                     outputs=[TensorSpec("o", "UINT64", [-1])], max_batch_size=4)
    doc = {"inputs": [{"name": "u", "datatype": "UINT64", "shape": [2],
                       "data": [2**64 - 1, 0]}]}
    assert parse(json.dumps(doc).encode(), spec=spec).inputs["u"].tolist() == [2**64 - 1, 0]
    doc["inputs"][0]["data"] = [2**64 - 1, -1]
    with pytest.raises(InvalidRequest, match="outside the range of UINT64"):
        parse(json.dumps(doc).encode(), spec=spec)


# --- 5,000 digits and deep nesting, anywhere ----------------------------------------


@pytest.mark.parametrize("place", [
    lambda: json_request(ids=ids(shape="@HOLE@")),
    lambda: json_request(ids=ids(data="@HOLE@")),
    lambda: json_request(parameters={"priority": "@HOLE@"}),
    lambda: json_request(parameters={"timeout": "@HOLE@"}),
    lambda: json_request(parameters={"custom": "@HOLE@"}),
    lambda: json_request(id="@HOLE@"),
    lambda: json_request(ids=ids(datatype="@HOLE@")),
    lambda: json_request(outputs="@HOLE@"),
    lambda: json_request(ids=ids(parameters={"binary_data_size": "@HOLE@"})),
], ids=["shape", "data", "priority", "timeout", "custom", "id", "datatype", "outputs",
        "binary_size"])
@pytest.mark.parametrize("raw", [DIGITS_5000, DEEP], ids=["5000-digits", "10000-deep"])
def test_huge_numbers_and_deep_nesting_anywhere_are_a_400(place, raw):
    refused(fill(place(), raw), "not valid JSON")


@pytest.mark.parametrize("place", [
    lambda: json_request(ids=ids(shape="@HOLE@")),
    lambda: json_request(ids=ids(data="@HOLE@")),
    lambda: json_request(parameters={"priority": "@HOLE@"}),
    lambda: json_request(parameters={"sequence_id": "@HOLE@"}),
    lambda: json_request(id="@HOLE@"),
    lambda: json_request(ids=ids(datatype="@HOLE@")),
    lambda: json_request(ids=ids(parameters="@HOLE@")),
    lambda: json_request(outputs=[{"name": "y", "parameters": {"binary_data": "@HOLE@"}}]),
], ids=["shape", "data", "priority", "sequence_id", "id", "datatype", "parameters",
        "binary_data"])
def test_nesting_json_allows_but_repr_would_not_is_a_short_400(place):
    message = refused(fill(place(), DEEP_1000))
    assert len(message) < 400


def test_an_unhashable_datatype_is_a_400():
    refused(json_request(ids=ids(datatype=[])), "unknown datatype []")
    refused(json_request(ids=ids(datatype={"a": 1})), "unknown datatype")


@pytest.mark.parametrize("value", ["²", "١٢", "12 3", "0x10", "+4", "1e3"])
def test_a_header_length_that_is_not_ascii_digits_is_a_400(value):
    refused(json_request(), "non-negative integer", headers={INFER_HEADER_LENGTH: value})
    check_content_length({"content-length": value}, 10)  # no crash: left to the reader


# --- limits, from the shape, before allocating ----------------------------------------


def test_the_item_and_element_limits_are_checked_from_the_shapes():
    limits = RequestLimits(max_items=1)
    with pytest.raises(PayloadTooLarge, match="carries 2 items"):
        parse(json_request(), limits=limits)
    with pytest.raises(PayloadTooLarge, match="hold 8 elements"):
        parse(json_request(), limits=RequestLimits(max_elements=7))
    assert parse(json_request(), limits=RequestLimits(max_elements=14)).batch_size == 2


def test_a_bytes_shape_of_a_trillion_is_refused_without_allocating_it():
    head = json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "ids", "datatype": "INT32", "shape": [1], "data": [1]},
        {"name": "text", "datatype": "BYTES", "shape": [10**12, 2],
         "parameters": {"binary_data_size": 8}}]}).encode()
    body = head + b"\x00" * 8
    limits = RequestLimits(max_items=10**13, max_elements=10**13)
    with pytest.raises(InvalidRequest, match="ends after 2 of 2000000000000 elements"):
        parse(body, {INFER_HEADER_LENGTH: str(len(head))}, limits=limits)


# --- outputs: never invalid JSON ------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_an_output_json_cannot_carry_is_refused_pointing_at_binary(value):
    y = np.array([1.0, value], np.float32)
    with pytest.raises(InvalidRequest, match=r"NaN or Infinity.*binary_data=true"):
        encode_infer_response("m", "1", None, {"y": y}, [], False)
    body, headers = encode_infer_response("m", "1", None, {"y": y}, [], True)
    assert int(headers[INFER_HEADER_LENGTH]) == len(body) - 8


def test_finite_outputs_whose_sum_overflows_are_sent():
    y = np.array([60000.0, 60000.0], np.float16)  # the float16 sum is inf; each is finite
    body, _ = encode_infer_response("m", "1", None, {"y": y}, [], False)
    assert json.loads(body)["outputs"][0]["data"] == [60000.0, 60000.0]


def test_outputs_of_any_byte_order_are_valid_json():
    y = np.array([1.5, -2.25], dtype=">f8")
    body, _ = encode_infer_response("m", "1", None, {"y": y}, [], False)
    assert json.loads(body)["outputs"][0]["data"] == [1.5, -2.25]


# --- generate -------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "words"), [
    ('{"text_input": "a", "max_tokens": ' + DIGITS_5000 + "}", "not valid JSON"),
    ('{"text_input": ' + DEEP + "}", "not valid JSON"),
    ('{"text_input": "a", "parameters": {"stop": ' + DEEP + "}}", "not valid JSON"),
    ('{"text_input": "a", "max_tokens": ' + DEEP_1000 + "}", "flat list of them"),
    ('{"text_input": "a", "parameters": {"stop": [["x"]]}}', "flat list of them"),
    ('{"text_input": "a", "max_tokens": NaN}', "not valid JSON"),
    ('{"text_input": "a", ' + '"k": 1, ' * 3 + '"k": [' + DEEP_1000 + "]}", "flat list"),
])
def test_hostile_generate_bodies_are_a_400(body, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_generate_body(body.encode())


_JSON_VALUES = st.one_of(st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False))


def _outcome(data: list, datatype: str) -> tuple:
    try:
        got = decode_json_data(data, datatype, [len(data)], "input 'x'")
    except InvalidRequest as e:
        return ("error", str(e))
    return (got.dtype.str, got.tolist())


@given(st.lists(_JSON_VALUES, min_size=1, max_size=12),
       st.sampled_from(["FP32", "FP64", "FP16", "INT32", "INT64", "UINT8", "UINT64", "BOOL"]))
@settings(max_examples=400, deadline=None)
def test_a_flat_list_read_the_fast_way_decodes_as_numpy_reading_it_does(data, datatype):
    fast = _outcome(data, datatype)
    real = jsondata._flat
    try:
        jsondata._flat = lambda data, target: None  # every list the long way
        assert _outcome(data, datatype) == fast
    finally:
        jsondata._flat = real
