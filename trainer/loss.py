"""Token-level losses. Tensors are ``[rows, response_len]``; ``weights`` is 0 outside the response mask.

Policy loss per token (see :mod:`trainer.config` for the citations)::

    ratio = exp(logp - old_logp)                            # π_θ / π_old (PPO; π_old the proximal policy)
    tis   = min(exp(old_logp - behaviour_logp), tis_cap)    # π_old / μ, detached (truncated IS)
    tis   = 1 if A ≥ 0 else min(π_old / μ, 1)               # behaviour_weight="tapered" (TOPR), instead
    keep  = m2_mask((old_logp - behaviour_logp)²)           # M2PO's trust region on the drift from μ
    pg    = -min(ratio · A, clip(ratio, 1 - clip_low, 1 + clip_high) · A) · tis · keep
    kl    = exp(ref - logp) - (ref - logp) - 1              # k3 estimator, ≥ 0
    loss  = Σ weights · (pg + kl_coef · kl)

``behaviour_weight = "tapered"`` is Tapered Off-Policy REINFORCE (Le Roux et al. 2025, *Tapered Off-Policy
REINFORCE: Stable and efficient reinforcement learning for LLMs*, arXiv:2503.14286): a sample with a
positive advantage is followed whatever policy drew it, one with a negative advantage is pushed down only
as far as the policy still produces it (weight min(π_old/μ, 1)), so stale failures cannot drive down
tokens the policy has already left. ``tis_capped_fraction`` then counts the negative tokens capped at 1.
``"tapered_sequence"`` takes the negative sample's ratio over its whole response (the product of its
tokens' π_old/μ, as the paper's trajectory ratio) instead of token by token.

``m2_mask`` (:func:`m2_keep`; ``AlgorithmConfig.m2_threshold``): when the mean squared log-ratio of the
microbatch's response tokens exceeds the threshold, the tokens with the largest squared log-ratio are
left out of the policy-gradient term until the mean over the rest is within it. Off by default: with it,
a delayed-feedback run and a 544-step replay both collapsed where the tapered weights did not
(docs/replay.md, "Stale data and late feedback").

Reported besides (diagnostics, no gradient): ``behaviour_kl``, the k3 estimate ``r − 1 − log r`` with
``r = π_old / μ`` of KL(μ ‖ π_old) on the behaviour policy's own samples — how far the policy being trained
is from the one that sampled the data, which the truncated weights only see token by token; ``nll``, the
mean −log π_old of the sampled tokens (the policy's entropy when the data is on-policy, that plus
KL(μ ‖ π_old) when it is not); ``kl`` to the reference whenever a reference is given, penalised or not.

``weights`` carries the per-episode normalisation and staleness factors computed in
:mod:`trainer.batching`, so the sum is already the batch mean over episodes.

Every logprob here (``logp``, ``old_logp``, ``ref``) is of the sample's sampling distribution,
softmax(logits / T) at the temperature its calls were sampled at (``Sample.temperature``), as the
behaviour logprobs are: the ratios then compare like with like, and the KL penalty is between the
policy's and the reference's distributions at that same temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.config import AlgorithmConfig


def gather_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """log softmax of ``logits`` ``[B, T, V]`` / ``temperature`` ``[B]`` at ``targets`` ``[B, T]`` (fp32).

    ``temperature``: each row's sampling temperature. Engines report the logprobs of the distribution
    they sampled from, softmax(logits / T) (vLLM's ``processed_logprobs``, infra/engine/sampling.py),
    so the policy's must be of the same distribution for ``exp(logp - behaviour_logp)`` to be the
    importance ratio; None: 1 for every row.
    """
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature.to(logits.device, torch.float32).view(-1, 1, 1)
    logp = F.log_softmax(logits, dim=-1)
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
    behaviour_kl_sum: float = 0.0
    nll_sum: float = 0.0
    m2_masked_tokens: float = 0.0
    m2_sum: float = 0.0  # Σ (log π_old/μ)² over the response tokens, before the mask


def m2_keep(m2: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """1 for the tokens M2PO keeps, 0 for those it masks (and outside ``mask``); see the module docstring.

    ``m2``: per-token squared log-ratio; ``mask``: 1 on response tokens. The kept set is every token
    but the k largest, with k the smallest count that brings the mean of the rest to ≤ ``threshold``.
    """
    flat = m2.detach().reshape(-1)
    where = torch.nonzero(mask.reshape(-1) > 0).squeeze(1)
    values = flat[where]
    n = values.numel()
    if n == 0 or float(values.mean()) <= threshold:
        return mask
    order = torch.argsort(values, descending=True)
    ordered = values[order]
    rest_sum = ordered.sum() - torch.cumsum(ordered, 0)  # what is left after masking the first i + 1
    rest_n = torch.arange(n - 1, -1, -1, device=m2.device, dtype=ordered.dtype)
    within = (rest_sum <= threshold * rest_n) & (rest_n > 0)
    k = int(torch.nonzero(within)[0].item()) + 1 if bool(within.any()) else n
    keep = mask.detach().clone().reshape(-1)
    keep[where[order[:k]]] = 0.0
    return keep.view_as(mask)


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
    log_ratio = (old_logp - behaviour_logp).detach().clamp(-20.0, 20.0)  # log π_old / μ
    behaviour_kl = ((torch.exp(log_ratio) - 1.0 - log_ratio) * mask).sum().item()
    if cfg.tis_cap is not None and cfg.behaviour_weight != "truncated":  # TOPR: positives 1, negatives ≤ 1
        if cfg.behaviour_weight == "tapered_sequence":  # the ratio of the whole sampled response
            log_ratio_row = (log_ratio * mask).sum(dim=-1, keepdim=True).clamp(max=20.0)
            raw_is = torch.exp(log_ratio_row).expand_as(logp).detach()
        else:
            raw_is = torch.exp((old_logp - behaviour_logp).clamp(max=20.0)).detach()
        tis = torch.where(advantages >= 0, torch.ones_like(raw_is), raw_is.clamp(max=1.0))
        capped = (((raw_is > 1.0) & (advantages < 0)).float() * mask).sum().item()
    elif cfg.tis_cap is not None:
        raw_is = torch.exp((old_logp - behaviour_logp).clamp(max=20.0)).detach()
        tis = raw_is.clamp(max=cfg.tis_cap)
        capped = ((raw_is > cfg.tis_cap).float() * mask).sum().item()
    else:
        tis = torch.ones_like(logp)
        capped = 0.0
    m2 = log_ratio * log_ratio
    keep = m2_keep(m2, mask, cfg.m2_threshold) if cfg.m2_threshold is not None else mask
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * advantages
    pg = -torch.min(surr1, surr2) * tis * keep
    clipped = ((surr2 < surr1).float() * mask).sum().item()
    per_token = pg
    kl_sum = 0.0
    if ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        if cfg.kl_coef > 0:
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
        behaviour_kl_sum=behaviour_kl,
        nll_sum=-(old_logp.detach() * mask).sum().item(),
        m2_masked_tokens=(mask - keep).sum().item(),
        m2_sum=(m2 * mask).sum().item(),
    )


def sft_loss(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood of the response tokens."""
    return -(logp * weights).sum()
