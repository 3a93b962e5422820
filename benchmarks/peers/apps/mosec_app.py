"""mosec 0.9.8 serving the mlp: Rust front, one Python worker, batch 64 / 2 ms.

`PEER_VARIANT=msgpack` (mosec's `MsgpackMixin`, a request is the item's raw FP32
bytes packed by msgpack, the answer likewise) or `json` (orjson both ways, the
answer a list of 256 floats). mosec reads `--port`/`--address` from argv itself.
"""

import os

import numpy as np
import orjson
from mosec import Server, Worker
from mosec.mixin import MsgpackMixin
from peer_model import DIM, PeerMLP


class _Base(Worker):
    def __init__(self):
        super().__init__()
        self.model = PeerMLP()


class MsgpackMLP(MsgpackMixin, _Base):
    def forward(self, data):
        x = np.frombuffer(b"".join(data), dtype=np.float32).reshape(len(data), DIM)
        return [row.tobytes() for row in self.model(x)]


class JsonMLP(_Base):
    def deserialize(self, data):
        return orjson.loads(data)

    def serialize(self, data):
        return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)

    def forward(self, data):
        return list(self.model(np.asarray(data, dtype=np.float32)))


if __name__ == "__main__":
    worker = MsgpackMLP if os.environ.get("PEER_VARIANT", "msgpack") == "msgpack" else JsonMLP
    server = Server()
    server.append_worker(worker, num=1, max_batch_size=64, max_wait_time=2)
    server.run()
