"""Token-level losses. Tensors are ``[rows, response_len]``; ``weights`` is 0 outside the response mask.

Policy loss per token (see :mod:`trainer.config` for the citations)::

    ratio = exp(logp - old_logp)                            # π_θ / π_old (PPO)
    tis   = min(exp(old_logp - behaviour_logp), tis_cap)    # π_old / μ, detached (truncated IS)
    pg    = -min(ratio · A, clip(ratio, 1 - clip_low, 1 + clip_high) · A) · tis
    kl    = exp(ref - logp) - (ref - logp) - 1              # k3 estimator, ≥ 0
    loss  = Σ weights · (pg + kl_coef · kl)

``weights`` carries the per-episode normalisation and staleness factors computed in
:mod:`trainer.batching`, so the sum is already the batch mean over episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.config import AlgorithmConfig


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax of ``logits`` ``[B, T, V]`` at ``targets`` ``[B, T]`` (fp32)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class LossParts:
    loss: torch.Tensor
    clipped_tokens: float
    kl_sum: float
    tis_sum: float
    tis_capped_tokens: float
    ratio_sum: float
    tokens: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    cfg: AlgorithmConfig,
    ref_logp: torch.Tensor | None = None,
) -> LossParts:
    """The clipped, importance-corrected policy-gradient loss; see the module docstring."""
    mask = (weights > 0).float()
    ratio = torch.exp(logp - old_logp)
    if cfg.tis_cap is not None:
        raw_is = torch.exp((old_logp - behaviour_logp).clamp(max=20.0)).detach()
        tis = raw_is.clamp(max=cfg.tis_cap)
        capped = ((raw_is > cfg.tis_cap).float() * mask).sum().item()
    else:
        tis = torch.ones_like(logp)
        capped = 0.0
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * advantages
    pg = -torch.min(surr1, surr2) * tis
    clipped = ((surr2 < surr1).float() * mask).sum().item()
    per_token = pg
    kl_sum = 0.0
    if ref_logp is not None and cfg.kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + cfg.kl_coef * kl
        kl_sum = (kl.detach() * mask).sum().item()
    loss = (per_token * weights).sum()
    return LossParts(
        loss=loss,
        clipped_tokens=clipped,
        kl_sum=kl_sum,
        tis_sum=(tis * mask).sum().item(),
        tis_capped_tokens=capped,
        ratio_sum=(ratio.detach() * mask).sum().item(),
        tokens=mask.sum().item(),
    )


def sft_loss(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood of the response tokens."""
    return -(logp * weights).sum()
