"""`ModelRoute`'s checks before anything is queued: the tensor, and how much one request
may carry (`limits.max_request_items`, bounded by default)."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import InvalidRequest, http_status
from cluster.config import ModelConfig
from deployments.batcher.actor import shard_config
from deployments.ingress.route import ModelRoute


def config(**fields) -> ModelConfig:
    return ModelConfig.model_validate({
        "name": "sq", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        "batching": {"max_batch_size": 4}, **fields})


def test_a_request_of_more_items_than_the_limit_is_refused_with_413_before_queueing():
    route = ModelRoute(config(), [lambda: None])
    assert len(route.input_array({"INPUT0": np.zeros(64, np.float32)})) == 64  # 16 x 4
    with pytest.raises(InvalidRequest, match=r"carries 65 items.*at most 64.*split it") as e:
        route.input_array({"INPUT0": np.zeros(65, np.float32)})
    assert http_status(e.value) == 413


def test_the_item_limit_is_configurable():
    route = ModelRoute(config(limits={"max_request_items": 2}), [lambda: None])
    with pytest.raises(InvalidRequest, match="at most 2 per request"):
        route.input_array({"INPUT0": np.zeros(3, np.float32)})


def test_each_batching_shard_bounds_its_queue_by_its_share_of_the_replicas():
    cfg = config(replicas={"min_replicas": 1, "max_replicas": 4}, batcher={"shards": 2})
    shard = shard_config(cfg)
    assert shard.replicas.max_replicas == 2
    # the count guard of a model admitted by time (limits.guard_batches), per shard
    assert shard.batching.default_queue_policy.max_queue_size == 64 * 4 * 2
    assert shard.batching.max_queue_wait_s == 1.0


def multi_config() -> ModelConfig:
    return ModelConfig.model_validate({
        "name": "two", "transformer": "deployments.models:Square",
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [-1]},
                   {"name": "b", "datatype": "INT32", "shape": [-1, 2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
        "batching": {"max_batch_size": 4}})


def test_codec_decoded_inputs_give_what_the_full_check_gives():
    route = ModelRoute(config(), [lambda: None])
    x = np.zeros(3, np.float32)
    assert route.decoded_array({"INPUT0": x}, 3) is route.input_array({"INPUT0": x})
    two = ModelRoute(multi_config(), [lambda: None])
    inputs = {"b": np.zeros((2, 2), np.int32), "a": np.ones(2, np.float32)}  # request order
    fast, full = two.decoded_array(inputs, 2), two.input_array(inputs)
    assert fast.names == full.names == ("a", "b")  # the declared order
    assert all(fast.tensors[n] is full.tensors[n] for n in fast.names)
    with pytest.raises(InvalidRequest, match="empty batch dimension"):  # None: checked all
        route.decoded_array({"INPUT0": np.zeros(0, np.float32)}, None)


def test_codec_decoded_inputs_keep_the_item_limit():
    route = ModelRoute(config(limits={"max_request_items": 2}), [lambda: None])
    with pytest.raises(InvalidRequest, match=r"carries 3 items.*at most 2 per request") as e:
        route.decoded_array({"INPUT0": np.zeros(3, np.float32)}, 3)
    assert http_status(e.value) == 413


@pytest.mark.parametrize("params, message", [
    ({"timeout": 5_000_000}, r"unknown parameter\(s\) \['timeout'\] \('timeout' is HTTP's"),
    ({"priorty": 1}, r"unknown parameter\(s\) \['priorty'\]: a handle call takes"),
    ([("priority", 1)], "parameters must be a dict"),
    ({"priority": "high"}, "priority must be a non-negative integer"),
    ({"priority": 1.5}, "priority must be a non-negative integer"),
    ({"priority": True}, "priority must be a non-negative integer"),
    ({"priority": -1}, "priority must be a non-negative integer"),
    ({"timeout_s": "5"}, "timeout_s must be a non-negative number"),
    ({"timeout_s": -1}, "timeout_s must be a non-negative number"),
    ({"timeout_s": float("nan")}, "timeout_s must be a non-negative number"),
    ({"timeout_s": float("inf")}, "timeout_s must be a non-negative number"),
    ({"timeout_s": True}, "timeout_s must be a non-negative number"),
    ({"timeout_s": 10**400}, "timeout_s must be a non-negative number"),  # OverflowError
    ({"sequence_id": 3, "sequence_start": "yes"}, "sequence_start and sequence_end must be"),
    ({"sequence_id": 3, "sequence_end": 1}, "sequence_start and sequence_end must be"),
])
def test_handle_parameters_are_checked_as_a_request_s_are(params, message):
    # a typo or a wrong type was ignored, or failed deep in the engine with a TypeError
    route = ModelRoute(config(), [lambda: None])
    with pytest.raises(InvalidRequest, match=message) as e:
        route.parameters(params)
    assert http_status(e.value) == 400


def test_good_handle_parameters_come_back_as_the_engine_takes_them():
    route = ModelRoute(config(), [lambda: None])
    assert route.parameters(None) == (None, None, None)
    assert route.parameters({}) == (None, None, None)
    assert route.parameters({"priority": 2, "timeout_s": 0.5}) == (2, 0.5, None)
    assert route.parameters({"timeout_s": 0, "sequence_id": "s", "sequence_start": True}) == \
        (None, 0, ("s", True, False))
