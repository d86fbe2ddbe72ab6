"""The training dtype and gradient checkpointing of the torch backend (:class:`trainer.config.ModelOptions`).

``dtype="bfloat16"`` is mixed precision, not a bf16 model: the trained parameters and Adam's moments stay
fp32, because an update ``lr * g`` below bf16's 8-bit mantissa (about 0.4% of a weight) would round away
on a bf16 weight and a small learning rate would train nothing. Every forward runs under
``torch.autocast(bfloat16)`` (matmuls in bf16: AMX on recent Xeons, tensor cores on a GPU) and the
backward follows its casts; the logits are upcast before the log-softmax, so log-probs and the loss are
fp32 (:func:`trainer.loss.gather_logprobs`). Weights nothing updates are stored in bf16 (a LoRA adapter's
frozen base, :mod:`trainer.lora`; the KL reference copy): half the memory, and autocast no longer
casts them at every forward.

``gradient_checkpointing``: transformers' non-reentrant checkpointing of every decoder layer, which keeps
one layer's activations at a time and recomputes them in the backward pass (about a third more compute
for a fraction of the activation memory: longer rows or bigger microbatches on a GPU). A KV cache cannot
be checkpointed, so the model's ``use_cache`` is turned off and the backend gives up sharing a group's
prompt (:mod:`trainer.backends.prefix`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainer.backends.base import BackendError
from trainer.config import ModelOptions

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def prepare_model(model: torch.nn.Module, options: ModelOptions) -> None:
    """Turn on gradient checkpointing if asked (a peft model's base model is the one that checkpoints)."""
    if not options.gradient_checkpointing:
        return
    get_base = getattr(model, "get_base_model", None)
    base: Any = get_base() if callable(get_base) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise BackendError(f"{type(base).__name__} does not support gradient checkpointing")
    # non-reentrant: no input needs requires_grad (peft's frozen embeddings: no enable_input_require_grads).
    # transformers 5.2x renamed it activation_checkpointing_enable (the old name warns, deprecated)
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if getattr(base, "config", None) is not None:
        base.config.use_cache = False


def autocast(options: ModelOptions, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The forward's precision: bf16 autocast, or nothing for fp32."""
    if options.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[options.dtype])


def freeze_to(module: torch.nn.Module, options: ModelOptions, keep: str | None = None) -> None:
    """Store the frozen parameters (those whose name lacks ``keep``) of ``module`` in the training dtype."""
    dtype = DTYPES[options.dtype]
    if dtype == torch.float32:
        return
    for name, param in module.named_parameters():
        if keep is None or keep not in name:
            param.data = param.data.to(dtype)
