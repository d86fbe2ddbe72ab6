"""A LoRA adapter per policy over one shared, frozen base (``peft``), each trained on its own.

One Hugging Face model is wrapped once by ``peft`` with one adapter per policy of the policy map
(:mod:`infra.policies`). Each adapter is an :class:`AdapterBackend`: the torch backend's whole step
(:mod:`trainer.backends.torch_backend`: the same loss, microbatches and temperature handling) over that
adapter's parameters only, with its own Adam state, version counter and checkpoints. A step activates
the adapter (``set_adapter``: only its factors get gradients) before its forward passes; the base never
changes, and neither do the other adapters.

What an adapter exports is peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``),
what the embedded engine's :meth:`~infra.engine.core.InferenceEngine.load_adapter` and vLLM's
``/v1/load_lora_adapter`` read.

Options (``FLYWHEEL_TRAINER_LORA__<FIELD>``), with their sources:
    rank: r, the adapter's rank. 8: Hu et al. 2021 (*LoRA: Low-Rank Adaptation of Large Language
        Models*, arXiv:2106.09685, §7.2, Table 6) find r = 1..8 on W_q, W_v as good as r = 64; also peft's
        default.
    alpha: the update is scaled by alpha / r. 16, twice the rank; Hu et al. (§4.1) set alpha to the
        first r they try and do not tune it, which makes alpha / r = 1 at r = 8; the common 2r keeps an
        update's size when the rank is halved or doubled in the same proportion, and Raschka's and
        Unsloth's guides recommend alpha = 2r.
    target_modules: the projections adapted. ``q_proj, v_proj``: Hu et al. §7.1, Table 5 — under a
        fixed parameter budget, adapting W_q and W_v together is best. Any of q, k, v, o, gate, up, down
        projections (the embedded engine adapts those).
    learning_rate: Adam's for the adapters, in RL and in SFT mode (the full fine-tune's
        ``learning_rate`` and ``sft_learning_rate`` are for the whole model). 2e-4: Hu et al. Table 11
        (GPT-2 M/L on E2E).
    dropout: 0. LoRA dropout (Hu et al. use 0.1 for GPT-2) would make the trainer's logprobs differ
        from the engine's, which serves without dropout, and every importance ratio would be noise.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from infra.logging import get_logger
from trainer.backends.base import BackendError
from trainer.backends.precision import freeze_to
from trainer.backends.torch_backend import OPTIMIZER_FILE, TorchBackend
from trainer.batching import Sample, TrainBatch
from trainer.config import AlgorithmConfig, LoraOptions, ModelOptions

log = get_logger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class _BaseOnly(torch.nn.Module):
    """The frozen base as the KL terms' reference: the peft model with every adapter switched off."""

    def __init__(self, peft_model: Any) -> None:
        super().__init__()
        self._peft = [peft_model]  # a list: not registered as a submodule (no second copy in state)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model = self._peft[0]
        with model.disable_adapter():
            return model(*args, **kwargs)


class AdapterBackend(TorchBackend):
    """One policy's adapter: the torch backend's step over its own parameters (the module docstring)."""

    def __init__(
        self, peft_model: Any, name: str, cfg: AlgorithmConfig, options: LoraOptions, **kw: Any
    ) -> None:
        self.name = name
        self.peft_model = peft_model
        params = [p for n, p in peft_model.named_parameters() if f".{name}." in n and "lora_" in n]
        if not params:
            raise BackendError(
                f"adapter {name} has no LoRA parameters (target modules {options.target_modules})"
            )
        reference = _BaseOnly(peft_model) if cfg.kl_coef > 0 or cfg.reference_kl else None
        # the adapter's rate for its RL and its SFT steps alike (SFT mode: trainer/policy_service.py)
        lr = options.learning_rate
        lora_cfg = cfg.model_copy(update={"learning_rate": lr, "sft_learning_rate": lr})
        super().__init__(peft_model, lora_cfg, params=params, reference=reference, share_prompts=False, **kw)
        self.params = params

    def _activate(self) -> None:
        self.peft_model.set_adapter(self.name)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self._activate()
        return super().train_step(batch)

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        self._activate()
        return super().sft_step(samples)

    def sequence_logprobs(self, samples: Sequence[Sample]) -> list[float]:
        self._activate()
        return super().sequence_logprobs(samples)

    # ------------------------------------------------------------------ the adapter's weights
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """peft's keys (``...q_proj.lora_A.weight``), as ``save_pretrained`` writes them."""
        state = get_peft_model_state_dict(self.peft_model, adapter_name=self.name)
        return {k: v.detach().contiguous().cpu() for k, v in state.items()}

    def state_dict(self) -> Mapping[str, Any]:
        return self.adapter_state()

    def export_weights(self, directory: Path) -> Path:
        """peft's adapter directory (config + safetensors); returns the directory."""
        directory.mkdir(parents=True, exist_ok=True)
        save_file(self.adapter_state(), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = self.peft_model.peft_config[self.name].to_dict()
        config["target_modules"] = sorted(config.get("target_modules") or [])
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1, default=str))
        return directory

    def save_checkpoint(self, directory: Path) -> None:
        self.export_weights(directory)
        torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)

    def load_checkpoint(self, directory: Path, version: int) -> None:
        try:
            state = load_file(str(directory / ADAPTER_WEIGHTS), device=str(self.device))
            result = set_peft_model_state_dict(self.peft_model, state, adapter_name=self.name)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise BackendError(
                    f"adapter checkpoint {directory} does not fit: unexpected {unexpected[:3]}"
                )
            opt = directory / OPTIMIZER_FILE
            if opt.exists():
                self.optimizer.load_state_dict(torch.load(opt, map_location=self.device, weights_only=True))
        except (OSError, RuntimeError, ValueError) as exc:
            raise BackendError(f"cannot load adapter checkpoint {directory}: {exc}") from exc
        self._version = version


class LoraPolicies:
    """The base, wrapped once, and one :class:`AdapterBackend` per policy."""

    def __init__(
        self,
        model: torch.nn.Module,
        names: Sequence[str],
        cfg: AlgorithmConfig,
        options: LoraOptions | None = None,
        *,
        device: str = "cpu",
        pad_id: int = 0,
        model_options: ModelOptions | None = None,
    ) -> None:
        """``model_options``: bf16 stores the frozen base in bf16 (the adapters stay fp32) and trains
        under autocast; gradient checkpointing recomputes the base's layers (:mod:`trainer.backends.precision`)."""
        if not names:
            raise BackendError("LoRA training needs at least one policy")
        self.options = options or LoraOptions()
        conf = LoraConfig(
            r=self.options.rank,
            lora_alpha=self.options.alpha,
            lora_dropout=self.options.dropout,
            target_modules=list(self.options.target_modules),
            bias="none",
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning of
            # transformers 5.x): theirs to change, and nothing here depends on it
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, conf, adapter_name=names[0])
            for name in names[1:]:
                peft_model.add_adapter(name, conf)
        model_options = model_options or ModelOptions()
        freeze_to(peft_model, model_options, keep="lora_")  # the base only: nothing updates it
        self.model = peft_model
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        self.adapters = {
            name: AdapterBackend(
                peft_model,
                name,
                cfg,
                self.options,
                device=device,
                pad_id=pad_id,
                vocab_size=vocab,
                model_options=model_options,
            )
            for name in names
        }
        log.info(
            "lora_adapters",
            policies=list(names),
            rank=self.options.rank,
            parameters_per_adapter=sum(p.numel() for p in self.adapters[names[0]].params),
            seconds=round(time.perf_counter() - t0, 3),
        )

    # The shared loop (trainer.service) holds this as its backend: a version and a vocabulary. Training,
    # weights and checkpoints are each adapter's (``adapters[name]``), never the whole model's.
    @property
    def version(self) -> int:
        """Steps taken over all adapters (each adapter's own version is ``adapters[name].version``)."""
        return sum(a.version for a in self.adapters.values())

    @property
    def vocab_size(self) -> int | None:
        return next(iter(self.adapters.values())).vocab_size

    def _per_adapter(self, what: str) -> BackendError:
        return BackendError(f"{what} is per adapter with a policy map: use adapters[name]")

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        raise self._per_adapter("train_step")

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        raise self._per_adapter("sft_step")

    def state_dict(self) -> Mapping[str, Any]:
        raise self._per_adapter("state_dict")

    def export_weights(self, directory: Path) -> Path:
        raise self._per_adapter("export_weights")

    def save_checkpoint(self, directory: Path) -> None:
        raise self._per_adapter("save_checkpoint")

    def load_checkpoint(self, directory: Path, version: int) -> None:
        raise self._per_adapter("load_checkpoint")

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""


def load_policies(
    model_dir: Path,
    names: Sequence[str],
    algo: AlgorithmConfig,
    options: LoraOptions | None = None,
    *,
    device: str = "cpu",
    torch_threads: int = 0,
    model_options: ModelOptions | None = None,
) -> LoraPolicies:
    """The Hugging Face causal LM in ``model_dir`` with one adapter per name."""
    if torch_threads:
        torch.set_num_threads(torch_threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    pad = getattr(model.config, "pad_token_id", None)
    pad_id = int(pad) if pad is not None else 0
    return LoraPolicies(
        model, names, algo, options, device=device, pad_id=pad_id, model_options=model_options
    )
