"""The algorithm's knobs, one typed object, grouped and cited like TRL's ``GRPOConfig``.

Parameters
----------
Algorithm
    algorithm: ``"grpo"`` (default) — critic-free policy gradient with group-relative advantages
        (``advantage`` picks the estimator; production sessions use ``production_baseline``) and the
        per-call credit of :mod:`trainer.credit`. ``"ppo"`` — PPO with a learned critic (Schulman et al.
        2017, *Proximal Policy Optimization Algorithms*, arXiv:1707.06347): a value head on the policy's
        last hidden state, GAE(γ, λ) advantages over each transition's generated tokens (Schulman et al.
        2016, *High-Dimensional Continuous Control Using Generalized Advantage Estimation*,
        arXiv:1506.02438), no group needed — the critic is the baseline, so single production sessions
        and all-equal groups train too. See :mod:`trainer.ppo`.
    vf_coef: weight of the value loss in the shared objective (PPO's ``c1``, eq. 9; 0.5 as in the
        paper's Atari runs and most implementations).
    value_clip: PPO's clipped value loss, ``max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²) / 2``
        (as in OpenAI baselines' ``ppo2``); inert with ``ppo_epochs = 1``.
    gae_gamma / gae_lambda: GAE's per-token discount and trace decay (γ = 1, λ = 0.95 as commonly used
        for language models, e.g. Ouyang et al. 2022, arXiv:2203.02155). The per-call discount of the
        reward service is already inside the returns.
    value_learning_rate: the value head's own Adam learning rate (it starts at zero and must catch up
        with the rewards faster than the policy moves; on the tests' tiny model 1e-3 left the value at
        0.01 after 16 single-session steps with rewards 1/0, 1e-2 separated liked (0.8) from not (0.4)).

Advantages
    advantage: ``"grpo"`` — reward minus the group mean, divided by the group std when ``scale_by_std``
        (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300; the same formula as verl's
        ``compute_grpo_outcome_advantage``). ``"rloo"`` — reward minus the mean of the *other* members
        (Ahmadian et al. 2024, *Back to Basics: Revisiting REINFORCE Style Optimization*, arXiv:2402.14740).
        ``"mean"`` — reward minus the group mean, no scaling (Dr. GRPO's recommendation, Liu et al. 2025,
        *Understanding R1-Zero-Like Training*, arXiv:2503.20783).
    scale_by_std: divide GRPO advantages by the group standard deviation (unbiased, + ``std_eps``).
    std_eps: added to the std, as verl's ``epsilon=1e-6``.

Loss
    clip_low / clip_high: PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with
        asymmetric bounds ("clip-higher", DAPO, Yu et al. 2025, arXiv:2503.14476). The ratio is
        πθ / π_old where π_old is the trainer's policy at the start of the step.
    ppo_epochs: gradient passes over each batch; with 1 the ratio is exactly 1 and clipping is inert, so
        no extra forward pass is spent on π_old.
    kl_coef: weight of the KL penalty to a frozen reference (the initial policy), estimated per token with
        Schulman's k3 estimator (http://joschu.net/blog/kl-approx.html), as in GRPO. 0 disables it and
        skips the reference forward pass.
    reference_kl: keep the frozen reference even with ``kl_coef = 0`` and report the same k3 estimate
        each step as ``reference_kl``, without penalising it (a diagnostic: one more forward pass).
    tis_cap: truncated importance sampling between π_old and the behaviour policy that generated the
        tokens: weight ``min(π_old/μ, tis_cap)`` per token, detached (Yao et al. 2025, *Your Efficient RL
        Framework Secretly Brings You Off-Policy RL Training*; verl ``rollout_is_threshold: 2.0``).
        ``None`` disables the correction. Replayed episodes get the same correction.
    behaviour_weight: the correction from the behaviour policy μ. ``"tapered"`` (default) — Tapered
        Off-Policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286): weight 1 on a positive
        advantage's tokens, ``min(π_old/μ, 1)`` on a negative one's (``"tapered_sequence"``: with the
        ratio of the whole response, as the paper's trajectory ratio). ``"truncated"`` — ``min(π_old/μ,
        tis_cap)`` on every token (the truncated importance sampling above). ``tis_cap = None`` turns
        either off.
    stale_policy: ``"weight"`` (default) trains a transition whatever its lag, with the off-policy
        correction; ``"drop"`` excludes, ``"downweight"`` decays those more than ``max_staleness``
        versions old. Under ``"weight"`` a transition trains like any other — late production feedback
        (rated minutes to days after the call) and replayed history are off-policy data, not waste. The correction is the decoupled
        objective above (Hilton et al. 2022, *Batch size-invariance for policy optimization*,
        arXiv:2110.00641; AReaL's decoupled PPO): π_old, the trainer's policy at the step, is the
        proximal policy the clip is measured against, the truncated weight ``min(π_old/μ, tis_cap)``
        corrects from the behaviour policy μ, and ``m2_threshold`` bounds the step's drift from μ.
        ``"drop"``: transitions more than ``max_staleness`` versions old are excluded (the
        bounded-staleness rule of asynchronous RL, e.g. AReaL, Fu et al. 2025, arXiv:2505.24298);
        ``"downweight"``: they are scaled by ``stale_decay ** (lag - max_staleness)``. Every exclusion is
        counted per reason (``excluded_<reason>`` in the step's figures, ``excluded`` in the status).
    max_staleness / stale_decay: the lag bound and decay of ``"drop"`` and ``"downweight"``.
    m2_threshold: the second-moment trust region of M2PO (Zheng et al. 2025, *Prosperity before
        Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?*, arXiv:2510.01161): per
        microbatch, the tokens with the largest ``(log π_old − log μ)²`` are masked out of the policy
        loss until the mean over the rest is ≤ the threshold (the paper's 0.04), so a step never follows
        tokens its policy has moved far from; the masked share is ``m2_masked_fraction``. ``None`` (the
        default) disables it: here it did not stop a delayed-feedback run or a long replay from collapsing
        (docs/replay.md).

Optimisation
    learning_rate, weight_decay, betas: Adam(W). A prototype on a 3 M model found 1e-4 stable and 5e-4
        collapsing.
    max_grad_norm: global gradient-norm clipping.
    lr_decay_steps / lr_final_ratio: a run of known length anneals: the policy's learning rate falls
        linearly from ``learning_rate`` at version 0 to ``lr_final_ratio`` times it at version
        ``lr_decay_steps``, and stays there (the linear schedule of fixed-length fine-tuning). ``None``
        (the default) keeps it constant, as an open-ended online run must; ``flywheel demo --source
        replay`` sets it to the recorded run's steps (docs/replay.md).
    token_budget: microbatch size in tokens (rows × padded length); gradients accumulate across
        microbatches so the budget only trades memory for speed.

Production sessions (a deployed agent's traffic; each a group of one, see :mod:`trainer.baselines`)
    production_baseline: ``"ema"`` (default) — REINFORCE with a baseline (Williams 1992, *Simple
        statistical gradient-following algorithms for connectionist reinforcement learning*, Machine
        Learning 8): a running exponential mean and variance of production rewards per (tenant, scorer),
        saved with the checkpoint. Chosen as the default because it gives signal to a step with a
        single production session, which a batch statistic cannot. ``"batch"`` — REINFORCE++'s global
        advantage normalisation across the production episodes of one step (Hu 2025, *REINFORCE++*,
        arXiv:2501.03262).
    production_ema_decay: weight of the history in the running mean/variance (α = 1 − decay per reward).
    production_scale_by_std: divide by the running std (floored at ``production_std_floor``, so a
        baseline that has only seen one reward value does not blow a new one up by 1/eps).
    production_max_per_step: production episodes trained in one step (the rest wait for the next).

SFT
    sft_reward_threshold: episodes with reward ≥ this are SFT targets.
    sft_learning_rate: the SFT learning rate (warm start and SFT mode).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AlgorithmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # algorithm
    algorithm: Literal["grpo", "ppo"] = "grpo"
    vf_coef: float = Field(default=0.5, ge=0)
    value_clip: float = Field(default=0.2, gt=0)
    gae_gamma: float = Field(default=1.0, gt=0, le=1)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    value_learning_rate: float = Field(default=1e-2, gt=0)
    # advantages
    advantage: Literal["grpo", "rloo", "mean"] = "grpo"
    scale_by_std: bool = True
    std_eps: float = Field(default=1e-6, gt=0)
    # loss
    clip_low: float = Field(default=0.2, ge=0)
    clip_high: float = Field(default=0.28, ge=0)
    ppo_epochs: int = Field(default=1, ge=1)
    kl_coef: float = Field(default=0.0, ge=0)
    reference_kl: bool = False
    tis_cap: float | None = Field(default=2.0, gt=0)
    behaviour_weight: Literal["truncated", "tapered", "tapered_sequence"] = "tapered"
    stale_policy: Literal["weight", "drop", "downweight"] = "weight"
    max_staleness: int = Field(default=4, ge=0)
    stale_decay: float = Field(default=0.5, gt=0, le=1)
    m2_threshold: float | None = Field(default=None, gt=0)
    # optimisation
    learning_rate: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(default=1.0, gt=0)
    lr_decay_steps: int | None = Field(default=None, ge=1)
    lr_final_ratio: float = Field(default=0.1, gt=0, le=1)
    token_budget: int = Field(default=8192, ge=16)
    # production sessions
    production_baseline: Literal["ema", "batch"] = "ema"
    production_ema_decay: float = Field(default=0.9, ge=0, lt=1)
    production_scale_by_std: bool = True
    production_std_floor: float = Field(default=0.1, gt=0)
    production_max_per_step: int = Field(default=256, ge=1)
    # sft
    sft_reward_threshold: float = 1.0
    sft_learning_rate: float = Field(default=1e-3, gt=0)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraOptions(BaseModel):
    """The LoRA adapters' shape and learning rate (``FLYWHEEL_TRAINER_LORA__<FIELD>``; :mod:`trainer.lora`'s
    docstring says where each default comes from)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(default=8, ge=1, le=1024)
    alpha: int = Field(default=16, ge=1)
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    learning_rate: float = Field(default=2e-4, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value

    @field_validator("target_modules")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [v for v in value if v not in LORA_TARGETS]
        if unknown or not value:
            raise ValueError(
                f"target_modules are some of {', '.join(LORA_TARGETS)}; got {', '.join(value) or 'none'}"
            )
        return value


class ModelOptions(BaseModel):
    """How the model is held while it trains (``FLYWHEEL_TRAINER_DTYPE``,
    ``FLYWHEEL_TRAINER_GRADIENT_CHECKPOINTING``; :mod:`trainer.backends.precision` says what each does)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False
