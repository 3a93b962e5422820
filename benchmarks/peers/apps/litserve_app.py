"""LitServe 0.2.19 serving the mlp over JSON: batch 64 / 2 ms, one worker, one API server.

A request is `{"input": [256 floats]}`, the answer `{"output": [256 floats]}`
(LitServe's documented batching: `batch`/`unbatch` around `predict`).
"""

import sys

import litserve as ls
import numpy as np
from peer_model import PeerMLP


class MLPAPI(ls.LitAPI):
    def setup(self, device):
        self.model = PeerMLP()

    def decode_request(self, request):
        return np.asarray(request["input"], dtype=np.float32)

    def batch(self, inputs):
        return np.stack(inputs)

    def predict(self, x):
        return self.model(x)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"output": output.tolist()}


if __name__ == "__main__":
    api = MLPAPI(max_batch_size=64, batch_timeout=0.002)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, fast_queue=True)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), num_api_servers=1, log_level="warning",
               generate_client_file=False)
