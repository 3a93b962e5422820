"""The Ray Serve baselines: the same transformer behind plain Serve and behind `@serve.batch`.

What is kept equal with the Raybatch app, so only the serving path differs:
- the model: the same `VectorTransformer` class built from the same `ModelConfig`,
  one replica, `OMP_NUM_THREADS=1`, the same `max_batch_size` and delay
  (`batch_wait_timeout_s` = Raybatch's `max_queue_delay_s`);
- one batch at a time: every batch runs on one dedicated thread (the model is a
  device that runs one batch after another, as in Raybatch's sync replica actor),
  while the replica's event loop keeps receiving; `@serve.batch` may form the next
  batch while one runs (`max_concurrent_batches=2`, like Raybatch's
  `max_inflight_batches=2`);
- pinning: where the model asks for it (`pin_core`), the replica process pins all
  its threads to that core, as the benchmark pins Raybatch's model replica process;
- HTTP: the same Open Inference Protocol codec as Raybatch's ingress
  (`parse_infer_request` / `encode_infer_response`), on Serve's plainest HTTP path
  (`__call__(starlette Request)`, no FastAPI), so parsing costs the same;
- the handle API: `infer(x)` with `x` one request's array (leading dimension 1);
- logging: log level WARNING, no access log, as Raybatch's app runs by default.

`BatchedStdJson` is `@serve.batch` with JSON tensors read and written the way Serve's
documentation shows (Starlette's `await request.json()` and `JSONResponse`: the
standard library's `json` both ways) and the data turned into an array with
`np.asarray`, less checking than the OIP codec. It is the peer a Serve user writes; the
targets are taken against `Batched`, which is given Raybatch's own orjson codec so that
only the serving path differs. Binary requests take the shared codec in both.

Batch counts (`stats()`) are kept in the replica, so the mean batch size is read
the same way for all three systems.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from batching.errors import InvalidRequest
from batching.model import instantiate, run_batch
from benchmarks.serve.models import MAX_BATCH_SIZE, BenchModel, pin_process
from cluster.config import ModelConfig, import_object
from deployments.ingress.deployment import model_spec
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    encode_infer_response,
    error_body,
    parse_infer_request,
)

MAX_BODY_BYTES = 64 * 2**20
MAX_ONGOING_REQUESTS = 2048  # as Raybatch's ingress: every request reaches the replica at once
MAX_CONCURRENT_BATCHES = 2


class _ServeModel:
    def __init__(self, model_json: str, pin_core: int | None) -> None:
        if pin_core is not None:
            pin_process(os.getpid(), pin_core)
        self.config = ModelConfig.model_validate_json(model_json)
        self.spec = model_spec(self.config)
        self.model = instantiate(import_object(self.config.transformer), (),
                                 dict(self.config.init_kwargs))
        # One thread is the model's device: batches run on it one after another.
        self._device = ThreadPoolExecutor(1)
        self._device.submit(self.model.setup, "cpu").result()
        self.batches = 0
        self.items = 0

    async def _run(self, x: np.ndarray) -> np.ndarray:
        self.batches += 1
        self.items += len(x)
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self._device, run_batch, self.model, x)
        return np.asarray(out, dtype=np.float32)

    async def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "items": self.items, "pid": os.getpid()}

    async def infer(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    async def __call__(self, request: Request) -> Response:
        try:
            body = await request.body()
            req = parse_infer_request(body, request.headers, self.spec, MAX_BODY_BYTES)
            y = await self.infer(req.inputs["INPUT0"])
        except InvalidRequest as e:
            return Response(error_body(str(e)), status_code=400, media_type="application/json")
        body, headers = encode_infer_response(self.config.name, self.config.version, req.id,
                                              {"OUTPUT0": y}, req.outputs_requested,
                                              req.binary_data_output)
        return Response(body, headers=headers)


class Plain(_ServeModel):
    """Ray Serve without batching: every request runs the model on its own item."""

    async def infer(self, x: np.ndarray) -> np.ndarray:
        return await self._run(x)


class Batched(_ServeModel):
    """Ray Serve's `@serve.batch` with the model's own max batch size and delay."""

    def __init__(self, model_json: str, pin_core: int | None) -> None:
        super().__init__(model_json, pin_core)
        self.infer.set_max_batch_size(self.config.batching.max_batch_size)
        self.infer.set_batch_wait_timeout_s(self.config.batching.max_queue_delay_s)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.002,
                 max_concurrent_batches=MAX_CONCURRENT_BATCHES)
    async def infer(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        y = await self._run(np.concatenate(xs))
        out, at = [], 0
        for x in xs:
            out.append(y[at : at + len(x)])
            at += len(x)
        return out


class BatchedStdJson(Batched):
    """`@serve.batch`, JSON tensors through Starlette's `request.json()`/`JSONResponse`."""

    async def __call__(self, request: Request) -> Response:
        if INFER_HEADER_LENGTH.lower() in request.headers:
            return await super().__call__(request)
        try:
            doc = await request.json()
            entry = doc["inputs"][0]
            x = np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return JSONResponse({"error": f"bad request: {e}"}, status_code=400)
        y = await self.infer(x)
        return JSONResponse({
            "model_name": self.config.name, "model_version": self.config.version,
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape),
                         "data": y.ravel().tolist()}]})


def serve_app(cls: type[_ServeModel], model: BenchModel) -> serve.Application:
    """`cls` as a one-replica deployment of `model`, with the replica's resources."""
    r = model.config.replicas
    deployment = serve.deployment(cls, name=cls.__name__,
                                  max_ongoing_requests=MAX_ONGOING_REQUESTS,
                                  # as Raybatch's app: no access-log record per request
                                  logging_config={"log_level": "WARNING",
                                                  "enable_access_log": False},
                                  ray_actor_options={
                                      "num_cpus": r.num_cpus,
                                      "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1",
                                                                   "MKL_NUM_THREADS": "1"}},
                                  })
    return deployment.bind(model.config.model_dump_json(), model.pin_core)
