"""PPO's critic: a value head on the policy's last hidden state, GAE, and the clipped value loss.

``AlgorithmConfig.algorithm = "ppo"`` (Schulman et al. 2017, arXiv:1707.06347; GAE: Schulman et al.
2016, arXiv:1506.02438). Per transition, over its *generated* tokens only (observation tokens of a
merged trajectory are skipped: the chain runs from one generated token to the next)::

    r_t   = the reward on token t: on the last generated token of each call (trainer.credit), else 0
    δ_t   = r_t + γ·V(t+1) − V(t)               V after the transition's last token = 0
    A_t   = δ_t + γλ·A_(t+1)                     (GAE)
    R_t   = A_t + V(t)                           the value target
    loss  = policy loss with A_t  +  vf_coef · Σ w_t · ½·max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²)

``V(t)`` is read at the position whose logits predict token ``t``, from the same forward pass as the
logprobs. Why a head on the policy rather than a separate critic: one forward pass gives both (the
policy step already pays for it), and on the CPU a second model would double the step; the value
gradient flows into the shared trunk scaled by ``vf_coef``, as in PPO's shared-parameter objective
(eq. 9). The head is zero-initialised, so the first advantages are the returns themselves. It is not
part of the exported model (the engine loads the policy's own weights); it is saved beside them in the
checkpoint as ``critic/value_head.safetensors`` (a subdirectory, so an engine pointed at the checkpoint
directory never reads it as policy weights).
"""

from __future__ import annotations

import torch

from trainer.config import AlgorithmConfig

# in a subdirectory: the engine's loader reads every *.safetensors at the top of a weights directory
VALUE_HEAD_FILE = "critic/value_head.safetensors"


def make_value_head(hidden_size: int, device: torch.device) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden_size, 1).to(device)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


def gae(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and value targets ``[rows, T]``, over the positions where ``mask`` is set."""
    values, rewards = values.detach().float(), rewards.float()
    adv = torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = torch.nonzero(mask[b] > 0, as_tuple=False).squeeze(-1)
        if idx.numel() == 0:
            continue
        v = values[b, idx]
        r = rewards[b, idx]
        out = torch.zeros_like(v)
        running = torch.zeros((), dtype=v.dtype, device=v.device)
        next_value = torch.zeros((), dtype=v.dtype, device=v.device)
        for i in range(v.shape[0] - 1, -1, -1):
            delta = r[i] + gamma * next_value - v[i]
            running = delta + gamma * lam * running
            out[i] = running
            next_value = v[i]
        adv[b, idx] = out
    return adv, adv + values


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    weights: torch.Tensor,
    cfg: AlgorithmConfig,
) -> torch.Tensor:
    """PPO's clipped value loss, weighted per token like the policy loss."""
    clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    per_token = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return (per_token * weights).sum()
