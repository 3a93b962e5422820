"""Fuzz (fixed seed): random `ModelInferRequest` protos, mostly near-valid, through the
ModelInfer codec, and as generate requests on a stream through their reading and the
generate parameters' checks. Every one either decodes to arrays of the declared datatype whose
element count is what their shape promises, or is refused with a typed error
(`InvalidRequest`, `PayloadTooLarge`); nothing else escapes (a servicer would answer
INTERNAL for it)."""

from __future__ import annotations

import random
import struct

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from batching.errors import InvalidRequest
from cluster.config import TensorConfig
from deployments.grpc.codec import CONTENTS_FIELD, read_infer_request
from deployments.grpc.generate import read_generate_request
from deployments.protocol import PayloadTooLarge
from deployments.protocol.datatypes import NUMPY_DTYPES
from deployments.wire.generation import generate_request

SEED, N = 20_261_130, 3000
MAX_BYTES = 1 << 16
DECLARED = {name: TensorConfig(name=name, datatype=dt, shape=shape) for name, dt, shape in [
    ("a", "FP32", (-1,)), ("b", "INT8", (-1, 2)), ("c", "BYTES", (-1,)),
    ("d", "BOOL", (-1,)), ("e", "UINT64", (-1,)), ("f", "FP16", (-1,))]}
DATATYPES = [*NUMPY_DTYPES, "", "fp32", "FP8", "BF16", "INT128", "STRING", "\x00"]
FIELDS = ["bool_contents", "int_contents", "int64_contents", "uint_contents",
          "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents"]
PARAMS = ["priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
          "triton_x", "binary_data_output", "other", ""]


def _shape(rng: random.Random) -> list[int]:
    pick = rng.random()
    if pick < 0.6:
        return [rng.randint(0, 4) for _ in range(rng.randint(1, 2))]
    return [rng.choice([-1, 0, 1, 2, 3, 2**31, 2**62, -2**63]) for _ in range(rng.randint(0, 4))]


def _values(rng: random.Random, field: str, n: int) -> list:
    if field == "bool_contents":
        return [rng.random() < 0.5 for _ in range(n)]
    if field == "bytes_contents":
        return [bytes(rng.randrange(256) for _ in range(rng.randint(0, 5))) for _ in range(n)]
    if field in ("fp32_contents", "fp64_contents"):
        return [rng.choice([0.5, -1.0, float("nan"), float("inf"), 1e38, 3.4e38])
                for _ in range(n)]
    low, high = {"int_contents": (-2**31, 2**31 - 1), "int64_contents": (-2**63, 2**63 - 1),
                 "uint_contents": (0, 2**32 - 1), "uint64_contents": (0, 2**64 - 1)}[field]
    return [rng.choice([low, high, 0, 1, -1 if low < 0 else 2, 127, 128, 255, 256])
            for _ in range(n)]


def _raw(rng: random.Random, datatype: str, n: int, corrupt: bool) -> bytes:
    if datatype == "BYTES":
        out = b"".join(struct.pack("<I", len(s)) + s
                       for s in (b"x" * rng.randint(0, 3) for _ in range(n)))
    else:
        size = NUMPY_DTYPES[datatype].itemsize if datatype in NUMPY_DTYPES else 4
        out = bytes(rng.randrange(256) for _ in range(n * size))
    pick = rng.random() if corrupt else 1.0
    if pick < 0.15:
        return out[:-1]
    if pick < 0.25:
        return out + b"\x07"
    if pick < 0.3:
        return struct.pack("<I", 2**32 - 1) + out
    return out


def request(rng: random.Random) -> pb.ModelInferRequest:
    """A request: about half of them valid but for their shapes' sizes (`tidy`), the rest
    wrong in any way at all."""
    req = pb.ModelInferRequest(model_name="m", id=rng.choice(["", "r1", "\u00e9" * 3]))
    tidy = rng.random() < 0.5
    if tidy:
        names = rng.sample(sorted(set(DECLARED) - {"f"}), rng.randint(1, 3))
    else:
        names = [rng.choice([*DECLARED, *DECLARED, "zz", ""]) for _ in range(rng.randint(0, 3))]
    use_raw = rng.random() < 0.5
    for name in names:
        declared = DECLARED.get(name)
        datatype = declared.datatype if declared and (tidy or rng.random() < 0.85) \
            else rng.choice(DATATYPES)
        shape = [rng.randint(0, 4), 2][:len(declared.shape)] if tidy else _shape(rng)
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        n = int(np.prod(shape)) if shape and all(0 <= d <= 16 for d in shape) else 1
        n = max(0, n + (0 if tidy else rng.choice([0, 0, 0, 0, 1, -1])))
        if use_raw:
            req.raw_input_contents.append(_raw(rng, datatype, n, not tidy))
        else:
            field = CONTENTS_FIELD.get(datatype, "fp32_contents")
            if not tidy and rng.random() < 0.15:
                field = rng.choice(FIELDS)
            getattr(tensor.contents, field).extend(_values(rng, field, n))
    if use_raw and not tidy and rng.random() < 0.1:
        req.raw_input_contents.append(b"\x00\x00\x00\x00")
    for _ in range(rng.randint(0, 0 if tidy else 2)):
        param = req.parameters[rng.choice(PARAMS)]
        kind = rng.choice(["int64_param", "uint64_param", "bool_param", "string_param",
                           "double_param", None])
        if kind == "int64_param":
            param.int64_param = rng.choice([-5, 0, 1, 2**63 - 1])
        elif kind == "uint64_param":
            param.uint64_param = rng.choice([0, 3, 2**64 - 1])
        elif kind == "bool_param":
            param.bool_param = rng.random() < 0.5
        elif kind == "string_param":
            param.string_param = rng.choice(["", "1", "x" * 100])
        elif kind == "double_param":
            param.double_param = rng.choice([0.5, float("nan")])
    for _ in range(rng.randint(0, 0 if tidy else 2)):
        req.outputs.add(name=rng.choice(["OUT", "a", ""]))
    return req


def test_every_request_decodes_to_what_it_declares_or_is_refused_with_a_typed_error():
    rng = random.Random(SEED)
    decoded = refused = 0
    for i in range(N):
        req = request(rng)
        try:
            got = read_infer_request(req, DECLARED, "m", MAX_BYTES)
        except (InvalidRequest, PayloadTooLarge) as e:
            assert str(e), (i, req)
            refused += 1
            continue
        decoded += 1
        assert [t.name for t in req.inputs] == list(got.inputs), (i, req)
        for tensor in req.inputs:
            array = got.inputs[tensor.name]
            assert array.dtype == NUMPY_DTYPES[DECLARED[tensor.name].datatype], (i, req)
            assert list(array.shape) == list(tensor.shape), (i, req)
            assert array.nbytes <= MAX_BYTES or array.dtype == object, (i, req)
    # the draw reaches both outcomes, not only the first check
    assert decoded > N // 4 and refused > N // 3, (decoded, refused)


GEN_TENSORS = {"text_input": "BYTES", "max_tokens": "INT32", "stop": "BYTES",
               "temperature": "FP32", "top_p": "FP64", "seed": "UINT64", "priority": "UINT32",
               "timeout": "INT64", "stream": "BOOL", "other": "FP32"}
GEN_OUTPUTS = {"text_output": TensorConfig(name="text_output", datatype="BYTES", shape=(-1,))}


def generate_request_proto(rng: random.Random) -> pb.ModelInferRequest:
    """A generate request on a stream: the prompt and parameters as tensors and as the
    parameters map, mostly near-valid."""
    req = pb.ModelInferRequest(model_name="g", id=rng.choice(["", "s1"]))
    if rng.random() < 0.4:
        return _tidy_generate(rng, req)
    names = ["text_input"] if rng.random() < 0.9 else []
    names += rng.sample(sorted(GEN_TENSORS), rng.randint(0, 3))
    use_raw = rng.random() < 0.5
    for name in dict.fromkeys(names):
        datatype = GEN_TENSORS[name] if rng.random() < 0.85 else rng.choice(DATATYPES)
        shape = rng.choice([[1], [1], [1, 1], [2], [0], [3, 1]])
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        n = int(np.prod(shape))
        if use_raw:
            if datatype == "BYTES":
                texts = [rng.choice([b"Once", b"", b"\xff\xfe", "é".encode(), b"x" * 50])
                         for _ in range(n)]
                req.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t
                                                       for t in texts))
            else:
                req.raw_input_contents.append(_raw(rng, datatype, n, rng.random() < 0.2))
        else:
            field = CONTENTS_FIELD.get(datatype, "fp32_contents")
            getattr(tensor.contents, field).extend(_values(rng, field, n))
    for _ in range(rng.randint(0, 3)):
        key = rng.choice([*GEN_TENSORS, "triton_enable_empty_final_response", "triton_x", ""])
        param = req.parameters[key]
        kind = rng.choice(["int64_param", "uint64_param", "bool_param", "string_param",
                           "double_param", None])
        if kind == "int64_param":
            param.int64_param = rng.choice([-1, 0, 1, 8, 2**63 - 1])
        elif kind == "uint64_param":
            param.uint64_param = rng.choice([0, 8, 2**64 - 1])
        elif kind == "bool_param":
            param.bool_param = rng.random() < 0.5
        elif kind == "string_param":
            param.string_param = rng.choice(["", "\n", "stop"])
        elif kind == "double_param":
            param.double_param = rng.choice([0.0, 0.5, 2.5, -1.0, float("nan"), float("inf")])
    return req


TIDY = {"max_tokens": ("INT32", "int_contents", [5]), "stop": ("BYTES", "bytes_contents", [b"."]),
        "temperature": ("FP32", "fp32_contents", [0.5]), "top_p": ("FP64", "fp64_contents", [0.9]),
        "seed": ("UINT64", "uint64_contents", [7]), "stream": ("BOOL", "bool_contents", [False])}


def _tidy_generate(rng: random.Random, req: pb.ModelInferRequest) -> pb.ModelInferRequest:
    """A valid generate request, its parameters as tensors or in the map."""
    prompt = req.inputs.add(name="text_input", datatype="BYTES", shape=rng.choice([[1], [1, 1]]))
    prompt.contents.bytes_contents.append(rng.choice([b"Once", "é".encode(), b"x" * 50]))
    for name in rng.sample(sorted(TIDY), rng.randint(0, 3)):
        datatype, field, values = TIDY[name]
        if rng.random() < 0.5:
            tensor = req.inputs.add(name=name, datatype=datatype, shape=[len(values)])
            getattr(tensor.contents, field).extend(values)
        elif datatype == "BYTES":
            req.parameters[name].string_param = values[0].decode()
        elif datatype == "BOOL":
            req.parameters[name].bool_param = values[0]
        elif datatype.startswith("FP"):
            req.parameters[name].double_param = values[0]
        else:
            req.parameters[name].int64_param = values[0]
    return req


def test_every_generate_request_becomes_a_checked_generation_or_is_refused():
    rng = random.Random(SEED + 1)
    made = refused = 0
    for i in range(N):
        req = generate_request_proto(rng)
        try:
            call = read_generate_request(req, GEN_OUTPUTS, "g", MAX_BYTES)
            gen = generate_request(call.request_id, call.prompt, call.parameters)
        except (InvalidRequest, PayloadTooLarge) as e:
            assert str(e), (i, req)
            refused += 1
            continue
        made += 1
        assert isinstance(gen.prompt, str) and isinstance(call.stream, bool), (i, req)
        assert gen.max_tokens is None or isinstance(gen.max_tokens, int), (i, req)
        assert all(isinstance(s, str) and s for s in gen.stop), (i, req)
    assert made > N // 4 and refused > N // 3, (made, refused)
