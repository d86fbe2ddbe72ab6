"""The embedded backend: a Hugging Face causal LM trained with Adam on the CPU (or one GPU).

Rows are ``prompt + response`` right-padded; the model predicts every next token and the loss reads
only the response positions, weighted per token by :mod:`trainer.batching`. Rows are packed into
microbatches of at most ``token_budget`` padded tokens (sorted by length so padding stays small) and
gradients accumulate across them, so one optimiser step sees the whole batch. Samples that share
their prompt (a GRPO group's first calls) run the prompt once per microbatch instead of once per sample
(:mod:`trainer.backends.prefix`; ``share_prompts=False`` turns that off); elsewhere the model computes
logits only from the microbatch's shortest prompt on (``logits_to_keep``), where the losses read them.
Every row's logits are divided by its sample's sampling temperature before the log-softmax (policy,
π_old, the PPO critic's pass and the reference alike; :func:`trainer.loss.gather_logprobs`), as the
engine's were.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from infra.logging import get_logger
from trainer.backends.attention import use_gqa_attention
from trainer.backends.base import BackendError
from trainer.backends.precision import autocast, freeze_to, prepare_model
from trainer.backends.prefix import (
    SharedRows,
    pack_clusters,
    shared_logprobs,
    split_by_prompt,
    supports_shared_prompts,
    takes_logits_to_keep,
)
from trainer.batching import Sample, TrainBatch
from trainer.config import AlgorithmConfig, ModelOptions
from trainer.loss import gather_logprobs, policy_loss, sft_loss
from trainer.ppo import VALUE_HEAD_FILE, gae, make_value_head, value_loss

log = get_logger(__name__)

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


class _Rows:
    """One microbatch as tensors aligned to the shifted sequence (position t predicts token t+1)."""

    def __init__(self, samples: Sequence[Sample], pad_id: int, device: torch.device) -> None:
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        width = max(lengths)
        ids, attn, weights, adv, behaviour, rewards = [], [], [], [], [], []
        for s, length in zip(samples, lengths, strict=True):
            pad = width - length
            ids.append(s.prompt_ids + s.response_ids + [pad_id] * pad)
            attn.append([1] * length + [0] * pad)
            # shifted by one: the logits at len(prompt) - 1 predict the first response token
            before = [0.0] * (len(s.prompt_ids) - 1)
            w, a, b = s.token_rows(pad)
            weights.append(before + w)
            adv.append(before + a)
            behaviour.append(before + b)
            rewards.append(before + (s.token_rewards or [0.0] * len(s.response_ids)) + [0.0] * pad)
        tokens = torch.tensor(ids, dtype=torch.long)
        self.ids = tokens.to(device)
        self.attn = torch.tensor(attn, dtype=torch.long).to(device)
        self.targets = tokens[:, 1:].to(device)
        self.weights = torch.tensor(weights, dtype=torch.float32).to(device)
        self.adv = torch.tensor(adv, dtype=torch.float32).to(device)
        self.behaviour = torch.tensor(behaviour, dtype=torch.float32).to(device)
        self.rewards = torch.tensor(rewards, dtype=torch.float32).to(device)  # PPO's per-token rewards
        # per row: the logits are divided by it, as the engine did before reporting its logprobs; None when
        # every row is at 1 (a division by 1 is exact, and skipping it saves a pass over [B, T, vocab] logits)
        temps = [s.temperature for s in samples]
        self.temperature: torch.Tensor | None = (
            None if all(t == 1.0 for t in temps) else torch.tensor(temps, dtype=torch.float32).to(device)
        )
        self.padded_tokens = len(samples) * width
        self.real_tokens = sum(lengths)
        # the first shifted position with a response target in any row: before it only prompt tokens,
        # whose logits no loss reads
        self.first = max(0, min(len(s.prompt_ids) for s in samples) - 1)


class TorchBackend:
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: AlgorithmConfig,
        *,
        version: int = 0,
        pad_id: int = 0,
        device: str | torch.device = "cpu",
        vocab_size: int | None = None,
        share_prompts: bool = True,
        params: Sequence[torch.nn.Parameter] | None = None,
        reference: torch.nn.Module | None = None,
        model_options: ModelOptions | None = None,
    ) -> None:
        """``params``: what the optimiser updates (default: every parameter of ``model``; a LoRA
        adapter's own, :mod:`trainer.lora`); ``reference``: the frozen reference of the KL terms
        (default: a copy of ``model`` as given); ``model_options``: dtype and gradient checkpointing
        (:mod:`trainer.backends.precision`)."""
        self.cfg = cfg
        self.model_options = model_options or ModelOptions()
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model.train()
        use_gqa_attention(self.model)
        prepare_model(self.model, self.model_options)
        self.pad_id = pad_id
        self._version = version
        config = getattr(model, "config", None)
        self._vocab_size = vocab_size or getattr(config, "vocab_size", None)
        # a checkpointed layer keeps no KV cache, and a shared prompt is one (trainer.backends.precision)
        checkpointed = self.model_options.gradient_checkpointing
        self.share_prompts = share_prompts and not checkpointed and supports_shared_prompts(self.model)
        self._keeps_logits: dict[int, bool] = {}  # id(model) → takes_logits_to_keep(model)
        self.value_head: torch.nn.Linear | None = None
        trained = list(params) if params is not None else list(self.model.parameters())
        groups: list[dict[str, Any]] = [{"params": trained, "lr": cfg.learning_rate}]
        if cfg.algorithm == "ppo":  # a critic beside the policy (trainer.ppo); shared prompts give no values
            hidden = getattr(config, "hidden_size", None)
            if hidden is None:
                raise BackendError("algorithm=ppo needs a model whose config has hidden_size")
            self.value_head = make_value_head(int(hidden), self.device)
            groups.append({"params": list(self.value_head.parameters()), "lr": cfg.value_learning_rate})
            self.share_prompts = False
        self._lrs = [float(g["lr"]) for g in groups]
        # the fused kernel updates every parameter in one pass (about 3% of a demo step on the CPU)
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=cfg.learning_rate,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=self.device.type in ("cpu", "cuda"),
        )
        # data-parallel hook (trainer.backends.ddp): sums every rank's gradients before clipping
        self.reduce_grads: Callable[[], None] | None = None
        self.reference: torch.nn.Module | None = None
        if reference is not None:
            self.reference = reference
        elif cfg.kl_coef > 0 or cfg.reference_kl:
            self.reference = copy.deepcopy(self.model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
            freeze_to(self.reference, self.model_options)  # frozen: bf16 storage when training in bf16

    def policy_lr(self) -> float:
        """The policy's learning rate for the step from this version (``lr_decay_steps``' schedule)."""
        base, steps = self._lrs[0], self.cfg.lr_decay_steps
        if steps is None:
            return base
        done = min(1.0, self._version / steps)
        return base * (1.0 - (1.0 - self.cfg.lr_final_ratio) * done)

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int | None:
        return int(self._vocab_size) if self._vocab_size is not None else None

    # ------------------------------------------------------------------ batching
    def _microbatches(self, samples: Sequence[Sample]) -> list[_Rows]:
        ordered = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
        out: list[_Rows] = []
        current: list[Sample] = []
        width = 0
        for s in ordered:
            length = len(s.prompt_ids) + len(s.response_ids)
            if current and (len(current) + 1) * max(width, length) > self.cfg.token_budget:
                out.append(_Rows(current, self.pad_id, self.device))
                current, width = [], 0
            current.append(s)
            width = max(width, length)
        if current:
            out.append(_Rows(current, self.pad_id, self.device))
        return out

    def _plan(self, samples: Sequence[Sample]) -> list[_Rows | SharedRows]:
        """Microbatches for a policy step: shared-prompt clusters first, then every other sample."""
        if not self.share_prompts:
            return list(self._microbatches(samples))
        clusters, rest = split_by_prompt(samples)
        shared = pack_clusters(clusters, self.cfg.token_budget, self.pad_id, self.device)
        return [*shared, *(self._microbatches(rest) if rest else [])]

    def _logprobs_values(self, rows: _Rows | SharedRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's logprobs and the value head's values, from one forward pass (PPO)."""
        assert isinstance(rows, _Rows) and self.value_head is not None
        with autocast(self.model_options, self.device):
            out = self.model(input_ids=rows.ids, attention_mask=rows.attn, output_hidden_states=True)
        values = self.value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1)
        return gather_logprobs(out.logits[:, :-1], rows.targets, rows.temperature), values

    def _logprobs(self, model: torch.nn.Module, rows: _Rows | SharedRows) -> torch.Tensor:
        with autocast(self.model_options, self.device):  # fp32 log-probs: gather_logprobs upcasts the logits
            if isinstance(rows, SharedRows):
                return shared_logprobs(model, rows)
            if rows.first > 0 and self._keeps_logits.setdefault(id(model), takes_logits_to_keep(model)):
                # the LM head and log-softmax over the vocabulary only where a response token is
                # predicted: a GRPO row's prompt is often half of it (tests/benchmarks/trainer_smollm2.py)
                keep = rows.targets.shape[1] + 1 - rows.first
                out = model(input_ids=rows.ids, attention_mask=rows.attn, logits_to_keep=keep)
                logp = gather_logprobs(out.logits[:, :-1], rows.targets[:, rows.first :], rows.temperature)
                return F.pad(logp, (rows.first, 0))  # the prompt's positions: 0, and weight 0 in every loss
            logits = model(input_ids=rows.ids, attention_mask=rows.attn).logits[:, :-1]
            return gather_logprobs(logits, rows.targets, rows.temperature)

    # ------------------------------------------------------------------ steps
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if not batch.samples and self.reduce_grads is None:  # a data-parallel rank may get no rows
            raise BackendError("empty batch")
        t0 = time.perf_counter()
        mbs = self._plan(batch.samples)
        olds: list[torch.Tensor | None] = [None] * len(mbs)
        refs: list[torch.Tensor | None] = [None] * len(mbs)
        # PPO: (advantages, value targets, old values) per microbatch, from the values before the step
        critic: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = [None] * len(mbs)
        ppo = self.value_head is not None
        with torch.no_grad():
            for i, rows in enumerate(mbs):
                if self.cfg.ppo_epochs > 1:
                    if ppo:
                        olds[i], values = self._logprobs_values(rows)
                        critic[i] = self._gae(rows, values)
                    else:
                        olds[i] = self._logprobs(self.model, rows)
                if self.reference is not None:
                    refs[i] = self._logprobs(self.reference, rows)
        totals = {"clipped": 0.0, "kl": 0.0, "tis": 0.0, "tis_capped": 0.0, "ratio": 0.0, "tokens": 0.0}
        totals.update({"behaviour_kl": 0.0, "nll": 0.0, "m2_masked": 0.0, "m2": 0.0})
        totals.update({"value_loss": 0.0, "value": 0.0, "return": 0.0, "advantage": 0.0})
        loss_sum = 0.0
        grad_norm = 0.0
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for _ in range(self.cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, rows in enumerate(mbs):
                adv = rows.adv
                if ppo:
                    logp, values = self._logprobs_values(rows)
                    critic_i = critic[i] if critic[i] is not None else self._gae(rows, values)
                    assert critic_i is not None
                    adv, returns, old_values = critic_i
                else:
                    logp = self._logprobs(self.model, rows)
                old = olds[i] if olds[i] is not None else logp.detach()
                assert old is not None
                parts = policy_loss(logp, old, rows.behaviour, adv, rows.weights, self.cfg, refs[i])
                loss = parts.loss
                if ppo:
                    v_loss = value_loss(values, old_values, returns, rows.weights, self.cfg)
                    loss = loss + self.cfg.vf_coef * v_loss
                    m = (rows.weights > 0).float()
                    totals["value_loss"] += v_loss.item()
                    totals["value"] += float((values.detach() * m).sum())
                    totals["return"] += float((returns * m).sum())
                    totals["advantage"] += float((adv * m).sum())
                loss.backward()  # type: ignore[no-untyped-call]
                loss_sum += loss.item()
                totals["clipped"] += parts.clipped_tokens
                totals["kl"] += parts.kl_sum
                totals["tis"] += parts.tis_sum
                totals["tis_capped"] += parts.tis_capped_tokens
                totals["ratio"] += parts.ratio_sum
                totals["tokens"] += parts.tokens
                totals["behaviour_kl"] += parts.behaviour_kl_sum
                totals["nll"] += parts.nll_sum
                totals["m2_masked"] += parts.m2_masked_tokens
                totals["m2"] += parts.m2_sum
            if self.reduce_grads is not None:
                self.reduce_grads()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
            self.optimizer.param_groups[0]["lr"] = self.policy_lr()
            self.optimizer.step()
        self._version += 1
        seconds = time.perf_counter() - t0
        n = max(1.0, totals["tokens"])
        real = sum(r.real_tokens for r in mbs) * self.cfg.ppo_epochs
        return {
            "loss": loss_sum / self.cfg.ppo_epochs,
            "clip_fraction": totals["clipped"] / n,
            "kl": totals["kl"] / n,
            "tis_mean": totals["tis"] / n,
            "tis_capped_fraction": totals["tis_capped"] / n,
            "ratio_mean": totals["ratio"] / n,
            "behaviour_kl": totals["behaviour_kl"] / n,
            "nll": totals["nll"] / n,
            "m2": totals["m2"] / n,
            "m2_masked_fraction": totals["m2_masked"] / n,
            **({"reference_kl": totals["kl"] / n} if self.reference is not None else {}),
            "grad_norm": grad_norm,
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "response_tokens": totals["tokens"] / self.cfg.ppo_epochs,
            "train_seconds": seconds,
            "train_tokens_per_s": real / seconds if seconds > 0 else 0.0,
            "microbatches": float(len(mbs)),
            **(
                {
                    "value_loss": totals["value_loss"] / self.cfg.ppo_epochs,
                    "value_mean": totals["value"] / n,
                    "return_mean": totals["return"] / n,
                    "advantage_mean": totals["advantage"] / n,
                }
                if ppo
                else {}
            ),
        }

    def _gae(
        self, rows: _Rows | SharedRows, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert isinstance(rows, _Rows)
        old_values = values.detach()
        adv, returns = gae(old_values, rows.rewards, rows.weights, self.cfg.gae_gamma, self.cfg.gae_lambda)
        return adv, returns, old_values

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        if not samples and self.reduce_grads is None:
            raise BackendError("empty SFT batch")
        t0 = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.sft_learning_rate
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        real = 0
        try:
            for rows in self._microbatches(samples):
                loss = sft_loss(self._logprobs(self.model, rows), rows.weights)
                loss.backward()  # type: ignore[no-untyped-call]
                total += loss.item()
                real += rows.real_tokens
            if self.reduce_grads is not None:
                self.reduce_grads()
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(
                    [p for g in self.optimizer.param_groups for p in g["params"]], self.cfg.max_grad_norm
                )
            )
            self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, self._lrs, strict=True):
                group["lr"] = lr
        self._version += 1
        seconds = time.perf_counter() - t0
        return {
            "sft_loss": total,
            "grad_norm": grad_norm,
            "train_seconds": seconds,
            "train_tokens_per_s": real / seconds if seconds > 0 else 0.0,
        }

    @torch.no_grad()
    def sequence_logprobs(self, samples: Sequence[Sample]) -> list[float]:
        """Sum of response-token logprobs per sample, in order (evaluation and tests)."""
        self.model.eval()
        try:
            out: list[float] = []
            for s in samples:
                rows = _Rows([s], self.pad_id, self.device)
                logp = self._logprobs(self.model, rows)
                out.append(float((logp * (rows.weights > 0).float()).sum()))
            return out
        finally:
            self.model.train()

    # ------------------------------------------------------------------ weights
    def state_dict(self) -> Mapping[str, Any]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def export_weights(self, directory: Path) -> Path:
        """One safetensors file; of tied tensors only the first name is kept (as ``save_pretrained``)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / WEIGHTS_FILE
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().contiguous().cpu()
        save_file(tensors, str(path), metadata={"format": "pt"})
        return path

    def _load_weights_file(self, path: Path) -> None:
        state = load_file(str(path), device=str(self.device))
        own = self.model.state_dict()
        kept = {own[k].data_ptr() for k in state if k in own}
        missing = [k for k in own if k not in state and own[k].data_ptr() not in kept]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise BackendError(
                f"weights in {path} do not fit the model: missing {missing}, unexpected {unexpected}"
            )
        self.model.load_state_dict(state, strict=False)

    def save_checkpoint(self, directory: Path) -> None:
        self.export_weights(directory)
        if self.value_head is not None:  # beside the model, never inside what the engine loads
            head = {k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
            (directory / VALUE_HEAD_FILE).parent.mkdir(parents=True, exist_ok=True)
            save_file(head, str(directory / VALUE_HEAD_FILE))
        torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)

    def load_checkpoint(self, directory: Path, version: int) -> None:
        try:
            self._load_weights_file(directory / WEIGHTS_FILE)
            head = directory / VALUE_HEAD_FILE
            if self.value_head is not None and head.exists():
                self.value_head.load_state_dict(load_file(str(head), device=str(self.device)))
            opt = directory / OPTIMIZER_FILE
            if opt.exists():
                state = torch.load(opt, map_location=self.device, weights_only=True)
                if len(state["param_groups"]) != len(self.optimizer.param_groups):
                    # a checkpoint of the other algorithm (with or without a critic): fresh Adam moments
                    log.warning("optimizer_state_not_restored", checkpoint=str(directory), reason="algorithm")
                else:
                    self.optimizer.load_state_dict(state)
        except (OSError, RuntimeError, ValueError) as exc:
            raise BackendError(f"cannot load checkpoint {directory}: {exc}") from exc
        self._version = version

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""


def load_backend(
    model_dir: Path,
    algo: AlgorithmConfig,
    *,
    device: str = "cpu",
    torch_threads: int = 0,
    model_options: ModelOptions | None = None,
) -> TorchBackend:
    """A torch backend around the Hugging Face causal LM in ``model_dir`` (fp32 weights: the trained
    parameters stay fp32 in bf16 mode too, :mod:`trainer.backends.precision`)."""
    if torch_threads:
        torch.set_num_threads(torch_threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    pad = getattr(model.config, "pad_token_id", None)
    pad_id = int(pad) if pad is not None else 0
    return TorchBackend(model, algo, device=device, pad_id=pad_id, model_options=model_options)
