"""Grouped-query attention without copying keys and values, for training on the CPU.

Transformers' ``sdpa`` attention lets ``scaled_dot_product_attention`` share key/value heads
(``enable_gqa``) only when there is no attention mask; with one (right-padded rows, the shared-prompt
cache of :mod:`trainer.backends.prefix`) it expands every key and value head to all the query heads it
serves, a copy per layer forward and a reduction back per layer backward. On CUDA that is the price of
the fused kernels; on the CPU, SDPA's kernel takes the mask and ``enable_gqa`` together, so the copies
buy nothing (measured: a demo step 11% faster; docs/results/tuning.md), and log-probabilities and
gradients are bit-identical (tested).

:func:`use_gqa_attention` switches a Hugging Face model to this implementation when it is on the CPU
and uses ``sdpa``; anything else is left as it is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GQA_SDPA = "flywheel_gqa_sdpa"


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: ``[B, heads, S, D]`` in, ``[B, S, heads, D]`` out."""
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    causal = causal and q_length > 1 and attention_mask is None
    if causal and key.shape[2] > q_length:
        # an empty static cache's prefill: the keys past the queries are padding (as transformers' sdpa does)
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` to :func:`gqa_sdpa_attention` if it is a CPU ``sdpa`` model; True if switched."""
    config = getattr(model, "config", None)
    setter = getattr(model, "set_attn_implementation", None)
    if config is None or setter is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if any(p.device.type != "cpu" for p in model.parameters()):
        return False
    AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
    setter(GQA_SDPA)
    return bool(config._attn_implementation == GQA_SDPA)
