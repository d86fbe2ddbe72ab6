"""The torch backend on a tiny random Qwen2: SFT, a toy bandit, microbatching, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.backends.base import Backend, BackendError
from trainer.backends.torch_backend import TorchBackend
from trainer.batching import BatchStats, Sample, TrainBatch, build_batch, sft_samples
from trainer.config import AlgorithmConfig
from trainer.groups import Group

from .helpers import episode, tiny_model, transition

PROMPT = [1, 2, 3]
GOOD = [10, 11, 12]
BAD = [20, 21, 22]


def _bandit_group(gid: str, version: int = 0) -> Group:
    g = Group(gid, 4, 0.0)
    for i, (resp, r) in enumerate([(GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0)]):
        t = transition(PROMPT, resp, reward=r, version=version)
        e = episode(gid, i, r, group_size=4, transitions=[t])
        g.members[e.episode_id] = e
    return g


def _probe(backend: TorchBackend) -> float:
    good, bad = backend.sequence_logprobs(sft_samples([(PROMPT, GOOD), (PROMPT, BAD)]))
    return good - bad


@pytest.mark.timeout(60)
def test_policy_moves_toward_rewarded_response() -> None:
    backend = TorchBackend(tiny_model(), AlgorithmConfig(m2_threshold=None, learning_rate=5e-3, tis_cap=None))
    assert isinstance(backend, Backend)
    before = _probe(backend)
    for step in range(15):
        batch = build_batch([_bandit_group(f"g{step}", backend.version)], backend.cfg, backend.version)
        metrics = backend.train_step(batch)
    after = _probe(backend)
    assert backend.version == 15
    assert after - before > 2.0, (before, after)
    assert metrics["response_tokens"] == 12
    assert metrics["clip_fraction"] == 0.0  # one epoch: ratio is exactly 1


@pytest.mark.timeout(60)
def test_a_run_of_known_length_anneals_its_learning_rate() -> None:
    cfg = AlgorithmConfig(learning_rate=1e-3, lr_decay_steps=4, lr_final_ratio=0.1)
    backend = TorchBackend(tiny_model(), cfg)
    rates = []
    for step in range(6):
        batch = build_batch([_bandit_group(f"g{step}", backend.version)], cfg, backend.version)
        rates.append(backend.train_step(batch)["learning_rate"])
    assert rates == pytest.approx([1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4])
    # an SFT step runs at its own rate and leaves the schedule where it was
    backend.sft_step(sft_samples([(PROMPT, GOOD)]))
    batch = build_batch([_bandit_group("g6", backend.version)], cfg, backend.version)
    assert backend.train_step(batch)["learning_rate"] == pytest.approx(1e-4)
    constant = TorchBackend(tiny_model(), AlgorithmConfig(learning_rate=1e-3))
    batch = build_batch([_bandit_group("c", 0)], constant.cfg, 0)
    assert constant.train_step(batch)["learning_rate"] == 1e-3


@pytest.mark.timeout(60)
def test_ppo_epochs_clip_and_kl_are_reported() -> None:
    cfg = AlgorithmConfig(m2_threshold=None, learning_rate=2e-2, ppo_epochs=4, kl_coef=0.1, tis_cap=None)
    backend = TorchBackend(tiny_model(), cfg)
    metrics = backend.train_step(build_batch([_bandit_group("g")], cfg, 0))
    assert metrics["clip_fraction"] > 0
    assert metrics["kl"] > 0


@pytest.mark.timeout(60)
def test_sft_step_lowers_loss() -> None:
    backend = TorchBackend(tiny_model(), AlgorithmConfig(sft_learning_rate=1e-2))
    data = sft_samples([(PROMPT, GOOD), ([4, 5], [6, 7, 8, 9])])
    losses = [backend.sft_step(data)["sft_loss"] for _ in range(8)]
    assert losses[-1] < losses[0] * 0.7, losses
    assert backend.optimizer.param_groups[0]["lr"] == backend.cfg.learning_rate


@pytest.mark.timeout(60)
def test_microbatching_gives_the_same_gradient() -> None:
    samples = [
        Sample(PROMPT, GOOD, [1, 1, 1], [-1.0] * 3, 1.0, 0.1, "a"),
        Sample([1, 2, 3, 4, 5, 6], BAD, [1, 0, 1], [-1.0, 0.0, -1.0], -1.0, 0.2, "b"),
        Sample([7], [8], [1], [-1.0], 0.5, 0.3, "c"),
    ]
    grads = []
    for budget in (16, 4096):
        backend = TorchBackend(tiny_model(seed=3), AlgorithmConfig(token_budget=budget, max_grad_norm=1e9))
        assert (len(backend._microbatches(samples)) > 1) == (budget == 16)
        backend.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign]
        backend.train_step(TrainBatch(samples, BatchStats(), []))
        grads.append(torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.timeout(60)
def test_checkpoint_roundtrip_and_errors(tmp_path: Path) -> None:
    a = TorchBackend(tiny_model(seed=1), AlgorithmConfig(sft_learning_rate=1e-2))
    a.sft_step(sft_samples([(PROMPT, GOOD)]))
    a.save_checkpoint(tmp_path / "ck")
    b = TorchBackend(tiny_model(seed=2), AlgorithmConfig())
    b.load_checkpoint(tmp_path / "ck", version=7)
    assert b.version == 7
    assert _probe(a) == pytest.approx(_probe(b), abs=1e-5)
    assert b.optimizer.state_dict()["state"]  # Adam moments came back too
    with pytest.raises(BackendError):
        b.load_checkpoint(tmp_path / "missing", version=1)
    with pytest.raises(BackendError):
        b.train_step(TrainBatch([], BatchStats(), []))
