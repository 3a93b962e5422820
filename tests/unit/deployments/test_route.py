"""`ModelRoute`'s checks before anything is queued: the tensor, and how much one request
may carry (`limits.max_request_items`, bounded by default)."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import InvalidRequest, http_status
from cluster.config import ModelConfig
from deployments.batcher import shard_config
from deployments.route import ModelRoute


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
    assert shard.batching.default_queue_policy.max_queue_size == 8 * 4 * 2
