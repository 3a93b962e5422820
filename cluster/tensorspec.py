"""A model's declared tensors: name, Open Inference Protocol datatype, shape with the
batch dimension first, and how ragged items of one tensor share a batch.

Part of the config (`cluster.config` re-exports it); kept apart because every layer
that checks requests against a model (signature, codecs, warm-up) reads only this.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")


class RaggedConfig(BaseModel):
    """How items of one tensor that differ in length share a batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["pad", "list"] = "pad"
    """pad: every item is padded to the batch's longest along `axis` with `pad_value`;
    list: the model gets this tensor as a list of per-item arrays, unpadded."""
    axis: int = Field(default=1, ge=1)
    """The dim that varies (0 is the batch dim); it must be -1 in the tensor's shape."""
    pad_value: float | int | str = 0
    """What padding holds (a string for BYTES tensors)."""


class TensorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Tensor name as clients send it (Triton's INPUT0/OUTPUT0 style)."""
    datatype: str
    """Open Inference Protocol datatype: FP32, INT64, BYTES ..."""
    shape: tuple[int, ...]
    """Shape with the leading batch dimension; -1 for a variable dimension."""
    ragged: RaggedConfig | None = None
    """For an input whose items differ in length (a -1 dim after the batch dim): padded
    in each batch, or handed over as a list. None: requests in one batch must agree."""

    @field_validator("datatype")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.upper() not in DATATYPES:
            raise ValueError(f"datatype={v!r} is not one of {', '.join(DATATYPES)}")
        return v.upper()

    @field_validator("shape")
    @classmethod
    def _batch_dim(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or v[0] != -1:
            raise ValueError(f"shape={list(v)} must start with -1, the batch dimension")
        if any(d < -1 or d == 0 for d in v):
            raise ValueError(f"shape={list(v)}: dimensions must be -1 or >= 1")
        return v

    @model_validator(mode="after")
    def _ragged_axis(self) -> TensorConfig:
        r = self.ragged
        if r is not None and r.mode == "pad" and (
                r.axis >= len(self.shape) or self.shape[r.axis] != -1):
            raise ValueError(f"tensor {self.name!r}: ragged.axis={r.axis} must name a -1 dim "
                             f"after the batch dim of shape={list(self.shape)}")
        if r is not None and isinstance(r.pad_value, str) != (self.datatype == "BYTES"):
            raise ValueError(f"tensor {self.name!r}: ragged.pad_value={r.pad_value!r} must be "
                             f"{'a string' if self.datatype == 'BYTES' else 'a number'} "
                             f"for datatype {self.datatype}")
        return self
