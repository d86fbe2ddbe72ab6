"""A hand-written forward pass with a slotted KV cache, for Llama-family decoder-only models.

Hugging Face's ``generate`` pads a whole batch to one length and cannot let a request join or leave
mid-flight. This runner owns the KV cache instead: one slot per running sequence (row ``i`` of a
``[slots, kv_heads, length, head_dim]`` tensor per layer), so a decode step runs every running
sequence, whatever its length, as one batched matmul per projection and one masked attention call.
Finished sequences free their slot by moving the last slot into the hole, so the running rows stay
``0..B-1`` and the step reads a view, not a gather.

It reads the weights straight from the Hugging Face module (Qwen2, Qwen3, Llama, Mistral share the
layout: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP), so loading new weights into that
module is all a weight update needs. Other architectures are refused at load with a clear error.
Sliding-window attention is not implemented (full attention is used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infra.engine.adapters import Adapter, add_deltas

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one this runner implements."""


@dataclass(frozen=True)
class _Layer:
    in_norm: nn.Module
    post_norm: nn.Module
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    gate: nn.Linear
    up: nn.Linear
    down: nn.Linear


def _rms(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    weight = norm.weight
    assert isinstance(weight, torch.Tensor)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVRunner:
    """Prefill and batched decode over a slotted KV cache; not thread-safe (one engine thread owns it)."""

    def __init__(self, model: nn.Module, *, max_model_len: int | None = None) -> None:
        config: Any = model.config
        model_type = str(getattr(config, "model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported by the embedded engine "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        act = str(getattr(config, "hidden_act", "silu"))
        if act not in ("silu", "swish"):
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only silu)")
        self.model = model
        self.config = config
        inner: Any = model.model
        self.embed: nn.Embedding = inner.embed_tokens
        self.final_norm: nn.Module = inner.norm
        self.lm_head: Any = model.lm_head
        self.layers = [
            _Layer(
                in_norm=layer.input_layernorm,
                post_norm=layer.post_attention_layernorm,
                q=layer.self_attn.q_proj,
                k=layer.self_attn.k_proj,
                v=layer.self_attn.v_proj,
                o=layer.self_attn.o_proj,
                q_norm=getattr(layer.self_attn, "q_norm", None),
                k_norm=getattr(layer.self_attn, "k_norm", None),
                gate=layer.mlp.gate_proj,
                up=layer.mlp.up_proj,
                down=layer.mlp.down_proj,
            )
            for layer in inner.layers
        ]
        self.n_heads = int(config.num_attention_heads)
        self.n_kv = int(getattr(config, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_heads)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.max_model_len = int(max_model_len or config.max_position_embeddings)
        self.dtype = self.embed.weight.dtype
        # Rotary tables from the model's own rotary module, so every rope variant it supports is exact.
        with torch.no_grad():
            positions = torch.arange(self.max_model_len).unsqueeze(0)
            probe = torch.zeros(1, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, positions)
        self.cos = cos[0].to(self.dtype)  # [max_len, head_dim]
        self.sin = sin[0].to(self.dtype)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._slots = 0
        self._length = 0
        # LoRA adapters by name (infra/engine/adapters.py) and, during one forward, which rows use which
        self.adapters: dict[str, Adapter] = {}
        self._rows: list[tuple[torch.Tensor, Adapter]] = []

    def projection_shapes(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(layer, projection) → (in_features, out_features): what an adapter's factors must fit."""
        out: dict[tuple[int, str], tuple[int, int]] = {}
        for i, layer in enumerate(self.layers):
            for proj in ("q", "k", "v", "o", "gate", "up", "down"):
                linear: nn.Linear = getattr(layer, proj)
                out[(i, proj)] = (int(linear.in_features), int(linear.out_features))
        return out

    def _select(self, names: Sequence[str | None] | None) -> None:
        """Group the forward's rows by adapter (rows of the base, or of an adapter not loaded: none)."""
        self._rows = []
        if not names or not self.adapters:
            return
        by: dict[str, list[int]] = {}
        for row, name in enumerate(names):
            if name is not None and name in self.adapters:
                by.setdefault(name, []).append(row)
        self._rows = [(torch.tensor(rows, dtype=torch.long), self.adapters[n]) for n, rows in by.items()]

    def _proj(self, i: int, proj: str, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = getattr(self.layers[i], proj)(x)
        return add_deltas(out, x, (i, proj), self._rows) if self._rows else out

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self._proj(i, "down", F.silu(self._proj(i, "gate", h)) * self._proj(i, "up", h))

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    # ----------------------------------------------------------------------------------- cache
    def reserve(self, slots: int, length: int) -> None:
        """Grow the cache to hold at least ``slots`` sequences of ``length`` positions (copies rows)."""
        if slots <= self._slots and length <= self._length:
            return
        new_slots = max(slots, self._slots, 1)
        new_slots = 1 << (new_slots - 1).bit_length()
        new_len = max(length, self._length, 16)
        new_len = min(1 << (new_len - 1).bit_length(), max(self.max_model_len, length))
        shape = (new_slots, self.n_kv, new_len, self.head_dim)
        ks = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]
        vs = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]
        for old, new in ((self._k, ks), (self._v, vs)):
            for o, n in zip(old, new, strict=False):  # old is empty after release()
                n[: o.shape[0], :, : o.shape[2]] = o
        self._k, self._v = ks, vs
        self._slots, self._length = new_slots, new_len

    def release(self) -> None:
        """Drop the cache (when idle) so a burst of long requests does not pin memory forever."""
        self._k, self._v = [], []
        self._slots = self._length = 0

    def move_slot(self, src: int, dst: int, length: int) -> None:
        for cache in (*self._k, *self._v):
            cache[dst, :, :length] = cache[src, :, :length]

    def copy_slot(self, src: int, dsts: Sequence[int], length: int) -> None:
        for cache in (*self._k, *self._v):
            cache[list(dsts), :, :length] = cache[src, :, :length]

    # --------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def prefill(self, token_ids: Sequence[int], slot: int) -> torch.Tensor:
        """Run a whole prompt into ``slot``; returns the last position's logits ``[vocab]`` (fp32)."""
        return self.prefill_many([token_ids], [slot])[0]

    @torch.no_grad()
    def prefill_many(
        self,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        adapters: Sequence[str | None] | None = None,
    ) -> torch.Tensor:
        """Run several prompts in one forward; returns each one's last-position logits ``[N, vocab]``.

        Prompts are right-padded to the longest. Causal attention means a real position only ever attends
        to earlier (real) positions, so padding changes nothing; the padded tail written into a slot's cache
        lies beyond its length and is overwritten by its next decode steps.
        """
        b, n = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(b, n, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        where = torch.tensor(list(slots), dtype=torch.long)
        self._select(adapters)
        x = self.embed(ids)  # [b, n, H]
        cos, sin = self.cos[:n], self.sin[:n]
        for i, layer in enumerate(self.layers):
            h = _rms(layer.in_norm, x)
            q = self._proj(i, "q", h).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
            k = self._proj(i, "k", h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
            v = self._proj(i, "v", h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = _rms(layer.q_norm, q), _rms(layer.k_norm, k)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self._k[i][where, :, :n] = k
            self._v[i][where, :, :n] = v
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
            x = x + self._proj(i, "o", att.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim))
            h = _rms(layer.post_norm, x)
            x = x + self._mlp(i, h)
        last_pos = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long)
        last = _rms(self.final_norm, x[torch.arange(b), last_pos])
        logits: torch.Tensor = self.lm_head(last).float()
        return logits

    @torch.no_grad()
    def decode(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        adapters: Sequence[str | None] | None = None,
    ) -> torch.Tensor:
        """One token for each of slots ``0..B-1`` at ``positions``; returns logits ``[B, vocab]`` (fp32)."""
        b = len(token_ids)
        ids = torch.tensor(token_ids, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        span = int(max(positions)) + 1
        rows = torch.arange(b)
        mask = (torch.arange(span).unsqueeze(0) <= pos.unsqueeze(1)).view(b, 1, 1, span)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [B, 1, D]
        self._select(adapters)
        x = self.embed(ids)  # [B, H]
        for i, layer in enumerate(self.layers):
            h = _rms(layer.in_norm, x)
            q = self._proj(i, "q", h).view(b, self.n_heads, self.head_dim)
            k = self._proj(i, "k", h).view(b, self.n_kv, self.head_dim)
            v = self._proj(i, "v", h).view(b, self.n_kv, self.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = _rms(layer.q_norm, q), _rms(layer.k_norm, k)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self._k[i][rows, :, pos] = k
            self._v[i][rows, :, pos] = v
            keys = self._k[i][:b, :, :span]
            values = self._v[i][:b, :, :span]
            att = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
            x = x + self._proj(i, "o", att.reshape(b, self.n_heads * self.head_dim))
            h = _rms(layer.post_norm, x)
            x = x + self._mlp(i, h)
        logits: torch.Tensor = self.lm_head(_rms(self.final_norm, x)).float()
        return logits


def model_eos_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    """The token ids that end a sequence: the generation config's, the model config's and the tokenizer's."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for source in (
        getattr(generation_config, "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
