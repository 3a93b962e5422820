"""Triton's Python-backend `model.py` for the mlp (copied into the model repository).

Triton's dynamic batcher (max batch 64, 2 ms, config.pbtxt) hands `execute` a list of
requests; their [1, 256] inputs are stacked, run as one batch, and split back into
one response each, as Triton's Python-backend examples do.
"""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_model import PeerMLP


class TritonPythonModel:
    def initialize(self, args):
        self.model = PeerMLP()

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        y = self.model(np.concatenate(xs))
        out, at = [], 0
        for x in xs:
            n = len(x)
            out.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", y[at:at + n])]))
            at += n
        return out

    def finalize(self):
        self.model.write_stats()
