"""Credit assignment: from an episode's advantage and its calls' returns to per-token advantages.

The reward service writes, per transition, the discounted return of each call it holds
(``Transition.segment_returns``, aligned with ``call_seqs``; ``segment_starts`` says where each call's
tokens begin, see :mod:`reward_service.transitions`). A token ``j`` of transition ``t`` of episode ``i``
that call ``k`` generated gets the advantage::

    A[i, t, j] = A_i + (G[t, k] − R_i) / s

- ``A_i``: the episode-level advantage — group-relative (:mod:`trainer.advantages`) or, for a
  production session, from the running baseline (:mod:`trainer.baselines`);
- ``R_i``: the episode reward; ``G[t, k]``: the return from call ``k`` on,
  ``Σ_{c ≥ k} γ^(c − k) r[c]`` with the per-call rewards ``r`` and the episode reward on the last call
  (a transition recorded without ``segment_returns`` gets ``A_i`` on every token, as before);
- ``s``: what ``A_i`` was divided by — ``std + eps`` of the group under GRPO with ``scale_by_std``, the
  running std for a production session, 1 otherwise.

Under GRPO this is ``(G[t, k] − mean_R) / (std_R + eps)``: each call's reward-to-go against the group's
baseline — REINFORCE with a baseline and reward-to-go (Williams 1992; Sutton & Barto 2018, §13.4), as
GRPO's process-supervision variant gives each token the normalised rewards of the steps after it (Shao
et al. 2024, arXiv:2402.03300, §4.1.3). With ``γ = 1`` and no per-call rewards ``G = R_i`` everywhere,
so every token gets ``A_i``: the episode-level credit assignment of LightningRL (Luo et al. 2025,
arXiv:2508.03680), unchanged. Observation tokens (mask 0) get a value too, but their loss weight is 0.

For PPO (:mod:`trainer.ppo`) the same returns become per-token rewards on the last generated token of
each call: ``G[k] − G[k+1]``, and ``G[last]`` on the transition's last call (the rest of the episode
as its tail), so the undiscounted sum from any call on telescopes back to that call's return ``G[k]``
(without segments: ``Transition.reward``, the transition's return, on its last generated token).
"""

from __future__ import annotations

from itertools import pairwise

from schemas import Transition


def segments(t: Transition) -> list[tuple[int, int, float]]:
    """``(start, end, return)`` per call of ``t``, covering ``response_ids``; one span without segments."""
    n = len(t.response_ids)
    starts, returns = t.segment_starts, t.segment_returns
    if not starts or returns is None or len(starts) != len(returns):
        return [(0, n, float(t.reward))]
    ends = [*starts[1:], n]
    return [(s, e, float(g)) for s, e, g in zip(starts, ends, returns, strict=True)]


def segments_valid(t: Transition) -> bool:
    """Segment fields absent, or aligned with each other and increasing within the response."""
    starts, returns = t.segment_starts, t.segment_returns
    if starts is None and returns is None:
        return True
    if starts is None or returns is None or len(starts) != len(returns) or not starts:
        return False
    if starts[0] != 0 or starts[-1] > len(t.response_ids):
        return False
    return all(a <= b for a, b in pairwise(starts))


def has_excess(t: Transition, reward: float, tol: float = 1e-9) -> bool:
    """Some call of ``t`` has a return other than the episode reward (per-call rewards, discount).

    Only transitions with ``segment_returns`` say so: one recorded before the reward service wrote
    them trains with the episode's advantage, as it did then.
    """
    if t.segment_returns is None:
        return False
    return any(abs(g - reward) > tol for _, _, g in segments(t))


def token_advantages(t: Transition, advantage: float, reward: float, scale: float) -> list[float] | None:
    """Per response token of ``t`` (see the module docstring); None when every token gets ``advantage``."""
    if not has_excess(t, reward):
        return None
    out = [0.0] * len(t.response_ids)
    for start, end, g in segments(t):
        value = advantage + (g - reward) / scale
        for j in range(start, end):
            out[j] = value
    return out


def token_rewards(t: Transition) -> list[float]:
    """PPO's per-token rewards: on the last generated token of each call (see the module docstring)."""
    out = [0.0] * len(t.response_ids)
    spans = segments(t)
    for k, (start, end, g) in enumerate(spans):
        last = next((j for j in range(end - 1, start - 1, -1) if t.response_mask[j]), None)
        if last is None:
            continue
        out[last] += g - (spans[k + 1][2] if k + 1 < len(spans) else 0.0)
    return out
