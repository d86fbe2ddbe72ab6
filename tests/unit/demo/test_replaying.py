"""The demo's replay plan (recorded pace), its checkpoint choice, and the trainer's off-policy figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.demo.checkpoints import Checkpoint, choose
from examples.demo.replaying import plan_steps
from flywheel.replay import ReplayReport, plan_replay
from trainer.batching import build_batch
from trainer.config import AlgorithmConfig
from trainer.groups import Group
from trainer.loss import policy_loss

from ..trainer.helpers import episode, transition


def _recorded_log() -> list:  # type: ignore[type-arg]
    """Four groups of two as a recorded run's log holds them: interleaved, completing in order b, a, d, c."""
    order = [("a", 0, 1.0), ("b", 0, 1.0), ("b", 1, 0.0), ("a", 1, 0.0), ("c", 0, 0.0), ("d", 0, 1.0)]
    order += [("d", 1, 1.0), ("c", 1, 0.0)]
    return [episode(g, i, r, task_id=f"t-{g}") for g, i, r in order]


@pytest.mark.timeout(10)
def test_steps_follow_the_order_the_recorded_trainer_took_the_groups() -> None:
    log = _recorded_log()
    planned = plan_replay(log, run_id="r", report=ReplayReport())
    plan = plan_steps(log, planned, 2, "recorded", seed=0)
    tasks = [[g[0].task_id for g in step] for step in plan.steps]
    assert tasks == [["t-b", "t-a"], ["t-d", "t-c"]]  # by completion (last member), not first member
    assert plan.groups == 4 and plan.signal_groups == 2  # c (0, 0) and d (1, 1) are flat
    assert all(len(g) == 2 for step in plan.steps for g in step) and plan.events == 8
    late = plan_steps(log, planned, 2, "late", seed=0)
    assert [[g[0].task_id for g in step] for step in late.steps] == [["t-d", "t-c"]]
    shuffled = plan_steps(log, planned, 4, "shuffled", seed=0)
    assert sorted(str(g[0].task_id) for g in shuffled.steps[0]) == ["t-a", "t-b", "t-c", "t-d"]


def _point(step: int, success: float) -> Checkpoint:
    return Checkpoint(step, step, step * 8, success, 2.0, 1.0, Path(f"v{step}"))


@pytest.mark.timeout(10)
def test_the_best_validation_checkpoint_is_served_and_the_warm_start_is_one_of_them() -> None:
    assert choose([_point(0, 0.30), _point(10, 0.45), _point(20, 0.40)]).step == 10
    assert choose([_point(0, 0.30), _point(10, 0.20), _point(20, 0.25)]).step == 0  # all worse: warm start
    assert choose([_point(0, 0.30), _point(10, 0.45), _point(20, 0.45)]).step == 20  # a tie: more data


@pytest.mark.timeout(10)
def test_batch_reports_the_recorded_versions_and_the_advantages_it_trains_on() -> None:
    g = Group("g", 3, 0.0)
    for i, (reward, version) in enumerate(((1.0, 7), (0.0, 9), (0.0, 8))):
        e = episode("g", i, reward, group_size=3, transitions=[transition(version=version, reward=reward)])
        g.members[e.episode_id] = e
    stats = build_batch([g], AlgorithmConfig(max_staleness=100), current_version=9).stats
    assert (stats.behaviour_version_min, stats.behaviour_version_max) == (7, 9)
    assert stats.behaviour_version_mean == pytest.approx(8.0)
    assert stats.advantage_positive == pytest.approx(1 / 3)
    # GRPO over (1, 0, 0): mean 1/3, std 0.577 → |A| = 1.155, 0.577, 0.577
    assert stats.advantage_abs_mean == pytest.approx((2 / 3 + 1 / 3 + 1 / 3) / 3 / 0.57735, rel=1e-4)


@pytest.mark.timeout(10)
def test_loss_reports_the_drift_from_the_behaviour_policy_and_the_reference_without_penalising_it() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    weights = torch.tensor([[0.5, 0.5]])
    adv = torch.ones(1, 2)
    cfg = AlgorithmConfig()
    same = policy_loss(logp, logp, logp, adv, weights, cfg)
    assert same.behaviour_kl_sum == pytest.approx(0.0) and same.kl_sum == 0.0
    assert same.nll_sum == pytest.approx(-float(logp.sum()))
    behaviour = torch.log(torch.tensor([[0.25, 0.25]]))  # μ; π_old / μ = 2 on the first token
    drifted = policy_loss(logp, logp, behaviour, adv, weights, cfg)
    assert drifted.behaviour_kl_sum == pytest.approx(2.0 - 1.0 - float(torch.log(torch.tensor(2.0))))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    measured = policy_loss(logp, logp, logp, adv, weights, cfg, ref_logp=ref)
    assert measured.kl_sum > 0.0  # reported with kl_coef = 0 ...
    assert float(measured.loss) == pytest.approx(float(same.loss))  # ... and not in the loss
    penalised = policy_loss(logp, logp, logp, adv, weights, AlgorithmConfig(kl_coef=1.0), ref_logp=ref)
    assert float(penalised.loss) > float(same.loss)
