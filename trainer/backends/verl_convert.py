"""Flywheel's training samples as verl's batch: the tensors verl 0.9's ``TrainingWorker`` trains on.

verl's actor reads a left-right padded batch (``verl/workers/utils/padding.py``,
``left_right_2_no_padding``): ``prompts`` left-padded to the longest prompt, ``responses``
right-padded to the longest response, ``input_ids = prompts ‖ responses``, ``attention_mask`` over
both, ``position_ids = cumsum(attention_mask) - 1`` (verl's ``compute_position_id_with_mask``), and per
response token: ``response_mask`` (the loss mask), ``old_log_probs``, ``advantages``.

How Flywheel's fields map:

- ``response_mask``: the sample's own mask. A merged trajectory (consecutive calls of one episode, see
  docs/architecture.md, "Token-faithful capture") carries tool/observation tokens inside its response with mask 0:
  they stay in ``input_ids`` and ``attention_mask`` (the model saw them) and out of the loss.
- ``old_log_probs`` and ``rollout_log_probs``: the behaviour logprobs the engine recorded (0 where the
  mask is 0). With ``algorithm.rollout_correction.bypass_mode`` verl uses them as π_old; otherwise verl
  recomputes π_old and ``rollout_is_weights = min(exp(old - rollout), threshold)`` is Flywheel's TIS.
- ``advantages``: the episode's advantage *times the sample's per-token weight*
  (:class:`~trainer.batching.Sample.token_weight`: per-episode normalisation and staleness) on every
  masked token. The clipped surrogate is positively homogeneous in the advantage
  (``min(r·cA, clip(r)·cA) = c·min(r·A, clip(r)·A)`` for ``c > 0``), so verl's ``token-sum`` aggregation
  of these advantages is exactly Flywheel's weighted sum (:mod:`trainer.loss`), episode normalisation
  included — which none of verl's ``loss_agg_mode`` values expresses by itself when an episode has
  several transitions. Tested against verl's own ``ppo_loss`` in ``tests/verl/``.

Only torch here (no verl import): the same tensors feed verl's ``DataProto`` where verl is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from trainer.backends.base import BackendError
from trainer.batching import Sample

#: what ``VerlBatch.tensors`` holds, in verl's names
FIELDS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "old_log_probs",
    "rollout_log_probs",
    "advantages",
)


@dataclass(frozen=True)
class VerlBatch:
    tensors: dict[str, torch.Tensor]
    episode_ids: list[str]

    @property
    def rows(self) -> int:
        return int(self.tensors["input_ids"].shape[0])


def to_verl_batch(samples: Sequence[Sample], pad_id: int, *, multiple_of: int = 1) -> VerlBatch:
    """verl's left-right padded tensors for ``samples`` (in order); widths rounded up to ``multiple_of``.

    Raises ``ValueError`` for a sample verl cannot train on: no prompt token (verl's response slicing
    needs one, ``no_padding_2_padding``), no response token, or fields of different lengths.
    """
    if not samples:
        raise ValueError("no samples to convert")
    for s in samples:
        n = len(s.response_ids)
        if not s.prompt_ids or n == 0:
            raise ValueError(f"episode {s.episode_id}: verl needs ≥ 1 prompt and ≥ 1 response token")
        if len(s.response_mask) != n or len(s.behaviour_logprobs) != n:
            raise ValueError(f"episode {s.episode_id}: response_ids, mask and logprobs differ in length")

    def up(width: int) -> int:
        return -(-width // multiple_of) * multiple_of

    p_width = up(max(len(s.prompt_ids) for s in samples))
    r_width = up(max(len(s.response_ids) for s in samples))
    prompts, responses, p_attn, r_attn, mask, logp, adv = [], [], [], [], [], [], []
    for s in samples:
        p_pad, r_pad = p_width - len(s.prompt_ids), r_width - len(s.response_ids)
        prompts.append([pad_id] * p_pad + list(s.prompt_ids))
        p_attn.append([0] * p_pad + [1] * len(s.prompt_ids))
        responses.append(list(s.response_ids) + [pad_id] * r_pad)
        r_attn.append([1] * len(s.response_ids) + [0] * r_pad)
        mask.append(list(s.response_mask) + [0] * r_pad)
        logp.append(
            [lp * m for lp, m in zip(s.behaviour_logprobs, s.response_mask, strict=True)] + [0.0] * r_pad
        )
        adv.append([s.advantage * s.token_weight * m for m in s.response_mask] + [0.0] * r_pad)
    prompt_t = torch.tensor(prompts, dtype=torch.long)
    response_t = torch.tensor(responses, dtype=torch.long)
    attention = torch.cat([torch.tensor(p_attn), torch.tensor(r_attn)], dim=1).long()
    behaviour = torch.tensor(logp, dtype=torch.float32)
    tensors = {
        "prompts": prompt_t,
        "responses": response_t,
        "input_ids": torch.cat([prompt_t, response_t], dim=1),
        "attention_mask": attention,
        "position_ids": (torch.cumsum(attention, dim=1) - 1).clamp(min=0),
        "response_mask": torch.tensor(mask, dtype=torch.long),
        "old_log_probs": behaviour,
        "rollout_log_probs": behaviour.clone(),
        "advantages": torch.tensor(adv, dtype=torch.float32),
    }
    return VerlBatch(tensors=tensors, episode_ids=[s.episode_id for s in samples])


def pad_rows(samples: Sequence[Sample], multiple: int) -> list[Sample]:
    """``samples``, then copies of the first with every response token masked out, up to a multiple of
    ``multiple`` rows: verl's dispatch splits a batch into one equal chunk per data-parallel rank
    (``chunk_tensordict``). A masked-out row is outside the ``token-sum`` loss, so it adds no loss and
    no gradient (verl's own trainer pads the same way, ``pad_dataproto_to_divisor``)."""
    missing = -len(samples) % multiple
    if not samples or not missing:
        return list(samples)
    first = samples[0]
    filler = replace(
        first,
        response_mask=[0] * len(first.response_ids),
        token_weight=0.0,
        episode_id=f"{first.episode_id}/padding",
    )
    return [*samples, *([filler] * missing)]


def batch_temperature(samples: Sequence[Sample]) -> float:
    """The one sampling temperature of ``samples`` (1.0 for none); a mix is a :class:`BackendError`."""
    temperatures = sorted({s.temperature for s in samples})
    if len(temperatures) > 1:
        raise BackendError(
            f"the verl backend trains one sampling temperature per step, and this batch mixes "
            f"{temperatures}: sample every trained call at one temperature, or use the torch backend"
        )
    return temperatures[0] if temperatures else 1.0
