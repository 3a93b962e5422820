"""`TinyLM`: a small character-level transformer decoder, the demo generative model.

Built in code with a fixed seed (nothing downloaded): 2 layers, d_model 64,
4 heads, a context of 256 characters, float64 so that a batched step and a
step of one sequence pick the same greedy token, and the same sampled one for
the same draw (float32 rounding differs with the batch's shape and can flip a
near-tie). Vocabulary: printable ASCII, newline and EOS; any other character is
read as "?", so `count_tokens` is `len`.

A sequence's state (`_State`) is its KV cache, the tokens consumed and the
pending token not yet fed. The caches live in one pool per model, a tensor with
a row (slot) per live sequence, kept compact: rows 0..n-1 are the live
sequences, and a freed row (its state was dropped: the Generator let it go) is
filled with the last one. So `step` over every live sequence (the usual case)
attends over a view of the pool, copying nothing, masks each sequence's own
length, feeds every pending token at its own position and writes the new keys
and values in place; a step over a subset gathers its rows first.
Untrained, the EOS logit carries a -10 bias, so outputs run to `max_tokens`;
`train_s` / `train_steps` fit the model at setup to a bundled text (a few KB,
written for this project) so it writes English-looking text and ends paragraphs
with EOS.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from batching.iterative.generative import StepModel

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"
EOS_ID = len(CHARS)
VOCAB = len(CHARS) + 1
_INDEX = {c: i for i, c in enumerate(CHARS)}
_UNKNOWN = _INDEX["?"]
CORPUS = Path(__file__).with_name("tinylm_corpus.txt")


class _Slot:
    """A sequence's row in the pool; moves when a lower row frees up."""

    __slots__ = ("row",)

    def __init__(self, row: int) -> None:
        self.row = row


class _State:
    """One sequence: its pool row, `length` tokens consumed, and `pending`, the token
    the next step feeds at position `length`."""

    __slots__ = ("__weakref__", "length", "pending", "slot")

    def __init__(self, slot: _Slot, length: int, pending: int) -> None:
        self.slot, self.length, self.pending = slot, length, pending


class _Pool:
    """KV caches of a model's live sequences: kv [2, layers, rows, heads, context, head_dim],
    rows 0..n-1 live. A row frees when its `_State` is garbage (weakref.finalize)."""

    def __init__(self, layers: int, heads: int, context: int, head_dim: int, device: str):
        import torch

        self.kv = torch.zeros((2, layers, 8, heads, context, head_dim), dtype=torch.float64,
                              device=device)
        self.slots: list[_Slot] = []
        self.lock = threading.RLock()  # finalizers may run on another Generator's thread
        self._busy = False  # a step or prefill holds row numbers: frees wait until it ends
        self._deferred: list[_Slot] = []

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Hold the pool for one prefill or step: rows do not move meanwhile."""
        with self.lock:
            self._busy = True
            try:
                yield
            finally:
                self._busy = False
                while self._deferred:
                    self._free(self._deferred.pop())

    def take(self, state_length: int, pending: int) -> _State:
        import torch

        with self.lock, torch.inference_mode():
            if len(self.slots) == self.kv.shape[2]:  # full: double the rows
                kv = torch.zeros_like(self.kv).repeat(1, 1, 2, 1, 1, 1)
                kv[:, :, :len(self.slots)] = self.kv
                self.kv = kv
            slot = _Slot(len(self.slots))
            self.slots.append(slot)
            state = _State(slot, state_length, pending)
            weakref.finalize(state, self._free, slot)
            return state

    def _free(self, slot: _Slot) -> None:
        import torch

        with self.lock, torch.inference_mode():  # the pool may be an inference tensor
            if self._busy:
                self._deferred.append(slot)
                return
            last = self.slots[-1]
            if last is not slot:  # move the last row into the hole: rows stay compact
                self.kv[:, :, slot.row] = self.kv[:, :, last.row]
                last.row = slot.row
                self.slots[slot.row] = last
            self.slots.pop()


def _net(vocab: int, context: int, d_model: int, heads: int, layers: int, seed: int) -> Any:
    import torch
    from torch import nn

    blocks = nn.ModuleList(nn.ModuleDict({
        "ln1": nn.LayerNorm(d_model), "qkv": nn.Linear(d_model, 3 * d_model),
        "proj": nn.Linear(d_model, d_model), "ln2": nn.LayerNorm(d_model),
        "fc": nn.Linear(d_model, 4 * d_model), "out": nn.Linear(4 * d_model, d_model),
    }) for _ in range(layers))
    net = nn.ModuleDict({"tok": nn.Embedding(vocab, d_model),
                         "pos": nn.Embedding(context, d_model), "blocks": blocks,
                         "ln_f": nn.LayerNorm(d_model), "head": nn.Linear(d_model, vocab)})
    gen = torch.Generator().manual_seed(seed)  # every random parameter is redrawn from it
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 2:
                embedding = name.startswith(("tok", "pos"))
                scale = 0.5 if embedding else 1 / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            elif name.endswith("bias"):
                p.zero_()
        net["head"].bias[EOS_ID] = -10.0
    return net


def _attend(q: Any, k: Any, v: Any, allowed: Any | None) -> Any:
    """Softmax attention; `allowed` (broadcast to [B, H, Tq, Tk]) masks each sequence's
    padding, None means causal. Masked weights are exactly 0: padding changes nothing."""
    import torch

    f = torch.nn.functional.scaled_dot_product_attention
    return f(q, k, v, is_causal=True) if allowed is None else f(q, k, v, attn_mask=allowed)


def _mlp(blk: Any, x: Any) -> Any:
    import torch

    return blk["out"](torch.nn.functional.gelu(blk["fc"](blk["ln2"](x))))


def _forward(net: Any, heads: int, idx: Any, lengths: Any | None = None) -> tuple[Any, list]:
    """Every position of `idx` [B, T] at once, causally: (hidden [B, T, D], [(k, v)] per
    layer, each [B, H, T, Dh]). `lengths` [B] masks each row's padding (a padding query
    also sees itself, so no row is all -inf: NaN would spread)."""
    import torch

    b, t = idx.shape
    ar = torch.arange(t, device=idx.device)
    allowed = None
    if lengths is not None:
        causal = ar[None, None, :] <= ar[None, :, None]
        real = ar[None, None, :] < lengths[:, None, None]
        allowed = (causal & (real | (ar[None, None, :] == ar[None, :, None])))[:, None]
    x = net["tok"](idx) + net["pos"](ar)
    d = x.shape[-1]
    kvs = []
    for blk in net["blocks"]:
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2)
                   for z in blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1))
        kvs.append((k, v))
        a = _attend(q, k, v, allowed)
        x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, d))
        x = x + _mlp(blk, x)
    return x, kvs


def _buckets(lengths: list[int], max_padding: float = 0.25) -> list[list[int]]:
    """Indices of `lengths` grouped for padded batches, longest first: a bucket grows
    while its padding stays within `max_padding` of its tokens. Zeros are left out."""
    buckets: list[list[int]] = []
    tokens = 0
    for i in sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i]):
        bucket = buckets[-1] if buckets else None
        if bucket and lengths[bucket[0]] * (len(bucket) + 1) <= (1 + max_padding) * (
                tokens + lengths[i]):
            bucket.append(i)
            tokens += lengths[i]
        else:
            buckets.append([i])
            tokens = lengths[i]
    return buckets


def _corpus_ids() -> list[int]:
    ids: list[int] = []
    for para in CORPUS.read_text().split("\n\n"):
        ids += [_INDEX.get(c, _UNKNOWN) for c in para.strip()] + [EOS_ID]
    return ids


def _train(net: Any, heads: int, seed: int, train_s: float, train_steps: int | None) -> int:
    """Fit `net` (float32) to the bundled text: for `train_steps` steps, else `train_s`
    seconds. Returns the steps taken."""
    import torch

    data = torch.tensor(_corpus_ids())
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    window, batch = min(128, net["pos"].num_embeddings), 16
    end_s, steps = time.monotonic() + train_s, 0
    net.train()
    while (steps < train_steps) if train_steps else (time.monotonic() < end_s):
        starts = torch.randint(0, len(data) - window - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + window] for s in starts])
        y = torch.stack([data[s + 1:s + window + 1] for s in starts])
        hidden, _ = _forward(net, heads, x)
        logits = net["head"](net["ln_f"](hidden))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    return steps


def _argmax(logits: Any) -> list[int]:
    return logits.argmax(dim=-1).tolist()


class TinyLM(StepModel):
    """Character-level generation with a small transformer decoder: greedy (`step`), or
    sampled (`step_logits`, the same forward pass).

    >>> m = TinyLM(); m.setup("cpu")
    >>> m.decode(m.encode("Hi\\tthere"))
    'Hi?there'
    """

    eos_id = EOS_ID
    max_context = 256

    def __init__(self, seed: int = 0, train_s: float = 0.0, train_steps: int | None = None,
                 threads: int | None = 1, d_model: int = 64, heads: int = 4,
                 layers: int = 2, context: int = 256) -> None:
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be a multiple of heads={heads}")
        self.seed, self.train_s, self.train_steps = seed, train_s, train_steps
        self.threads = threads
        self.d_model, self.heads, self.layers, self.max_context = d_model, heads, layers, context
        self.net: Any = None
        self._pool: Any = None
        self.trained_steps = 0
        self.weights_cached = False  # True: the trained weights were loaded, not computed

    def setup(self, device: str) -> None:
        import torch

        super().setup(device)
        if self.threads:
            from deployments.models.simple import set_torch_threads

            set_torch_threads(self.threads)
        net = _net(VOCAB, self.max_context, self.d_model, self.heads, self.layers, self.seed)
        if self.train_steps:  # deterministic: computed once per key, then loaded
            net.load_state_dict(self._trained_state(net))
            self.trained_steps = self.train_steps
        elif self.train_s > 0:  # as many steps as fit in train_s: not cacheable
            self.trained_steps = _train(net, self.heads, self.seed, self.train_s, None)
        self.net = net.to(device=device, dtype=torch.float64).eval().requires_grad_(False)
        self._pool = _Pool(self.layers, self.heads, self.max_context,
                           self.d_model // self.heads, device)

    def _trained_state(self, net: Any) -> dict[str, Any]:
        """`net` after `train_steps` steps, from the weight cache (`weightcache`)."""
        from deployments.models.weightcache import cache_key, cached_state

        params = {"seed": self.seed, "steps": self.train_steps, "d_model": self.d_model,
                  "heads": self.heads, "layers": self.layers, "context": self.max_context}
        # This module's source in the key: a change to how the net is built or trained
        # means new weights, never the old file.
        key = cache_key("tinylm", params, CORPUS.read_bytes() + Path(__file__).read_bytes())

        def train() -> dict[str, Any]:
            _train(net, self.heads, self.seed, 0.0, self.train_steps)
            return net.state_dict()

        state, self.weights_cached = cached_state(key, train)
        return state

    @classmethod
    def cache_weights(cls, **init_kwargs: Any) -> None:
        """Train now (if not cached yet) so the next setup with these arguments loads."""
        if init_kwargs.get("train_steps"):
            cls(**init_kwargs).setup("cpu")

    @property
    def live(self) -> int:
        """Sequences holding a row of the KV pool."""
        return len(self._pool.slots)

    # -- text ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [_INDEX.get(c, _UNKNOWN) for c in text]

    def decode(self, tokens: list[int]) -> str:
        return "".join(CHARS[t] for t in tokens if t < EOS_ID)

    @staticmethod
    def count_tokens(text: str) -> int:
        return len(text)

    # -- steps --------------------------------------------------------------------------
    def prefill(self, prompts: list[list[int]]) -> list[_State]:
        """Feed each prompt but its last token (which stays pending), in padded batches of
        similar lengths; the padding is masked, so a cache never depends on its company."""
        import torch

        if max(map(len, prompts)) > self.max_context:
            raise ValueError(f"a prompt of {max(map(len, prompts))} tokens does not fit the "
                             f"context of {self.max_context}")
        pool, dev = self._pool, self.device
        with pool.using(), torch.inference_mode():
            states = [pool.take(len(p) - 1, p[-1]) for p in prompts]
            for bucket in _buckets([len(p) - 1 for p in prompts]):
                t = len(prompts[bucket[0]]) - 1
                idx = torch.tensor([prompts[i][:-1] + [0] * (t + 1 - len(prompts[i]))
                                    for i in bucket], device=dev)
                lengths = torch.tensor([len(prompts[i]) - 1 for i in bucket], device=dev)
                rows = torch.tensor([states[i].slot.row for i in bucket], device=dev)
                padded = bool((lengths < t).any())
                _, layer_kv = _forward(self.net, self.heads, idx, lengths if padded else None)
                for layer, (k, v) in enumerate(layer_kv):  # padding rows: masked until fed
                    pool.kv[0, layer, rows, :, :t] = k
                    pool.kv[1, layer, rows, :, :t] = v
        return states

    def step(self, states: list[_State]) -> tuple[list[int], list[_State]]:
        """Feed every pending token at its own position; the greedy next token of each."""
        return self._advance(states, _argmax)

    def step_logits(self, states: list[_State],
                    choose: Callable[[Any], list[int]]) -> tuple[list[int], list[_State]]:
        """`step`, the next tokens picked by `choose(logits)` (a float64 tensor
        [len(states), VOCAB], row i for states[i]) instead of argmax."""
        return self._advance(states, choose)

    def _advance(self, states: list[_State],
                 choose: Callable[[Any], list[int]]) -> tuple[list[int], list[_State]]:
        import torch

        with torch.inference_mode():
            tokens = choose(self._logits(states))
        if len(tokens) != len(states):
            raise ValueError(f"choose answered {len(tokens)} tokens for {len(states)} states")
        for s, token in zip(states, tokens):
            s.length, s.pending = s.length + 1, token
        return tokens, states

    def _logits(self, states: list[_State]) -> Any:
        """Feed every pending token at its own position (the caches grow by one); the
        next-token logits [len(states), VOCAB], in `states` order."""
        import torch

        pool, dev = self._pool, self.device
        with pool.using(), torch.inference_mode():
            order = sorted(range(len(states)), key=lambda i: states[i].slot.row)
            batch = [states[i] for i in order]  # in row order
            b, t = len(batch), max(s.length for s in batch) + 1
            if t > self.max_context:
                raise ValueError(f"a sequence reached the context of {self.max_context} tokens")
            everyone = b == len(pool.slots)  # rows 0..b-1, in order: attend over a view
            rows = torch.arange(b, device=dev) if everyone else torch.tensor(
                [s.slot.row for s in batch], device=dev)
            kv = pool.kv[:, :, :b, :, :t] if everyone else pool.kv[:, :, rows, :, :t]
            pos = torch.tensor([s.length for s in batch], device=dev)
            net, ar = self.net, torch.arange(b, device=dev)
            x = net["tok"](torch.tensor([s.pending for s in batch], device=dev)) + net["pos"](pos)
            allowed = (torch.arange(t, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
            d = x.shape[-1]
            for layer, blk in enumerate(net["blocks"]):
                q, k, v = (z.view(b, self.heads, d // self.heads)
                           for z in blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1))
                kv[0, layer, ar, :, pos], kv[1, layer, ar, :, pos] = k, v
                if not everyone:  # kv is a gathered copy: write the pool too
                    pool.kv[0, layer, rows, :, pos], pool.kv[1, layer, rows, :, pos] = k, v
                a = _attend(q[:, :, None], kv[0, layer], kv[1, layer], allowed)
                x = x + blk["proj"](a.reshape(b, d))
                x = x + _mlp(blk, x)
            logits = net["head"](net["ln_f"](x))  # in row order
            if order != list(range(b)):  # back to the order of `states`
                logits = logits[torch.tensor(order, device=dev).argsort()]
        return logits

    def reference(self, ids: list[int], num_tokens: int) -> list[int]:
        """Greedy continuation of `ids` recomputing the whole sequence every token (no
        cache, no batch): the yardstick of `prefill`/`step` in tests."""
        import torch

        ids = list(ids)
        with torch.inference_mode():
            for _ in range(num_tokens):
                x = torch.tensor([ids], device=self.device)
                hidden, _ = _forward(self.net, self.heads, x)
                ids.append(int(self.net["head"](self.net["ln_f"](hidden[0, -1])).argmax()))
        return ids[-num_tokens:] if num_tokens else []
