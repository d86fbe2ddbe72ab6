"""Loss masking, per-episode normalisation, importance weights, clipping, KL and staleness."""

from __future__ import annotations

import math

import pytest
import torch

from schemas import EpisodeSource
from trainer.batching import build_batch
from trainer.config import AlgorithmConfig
from trainer.groups import Group
from trainer.loss import policy_loss

from .helpers import episode, transition


def _group(gid: str, *episodes) -> Group:  # type: ignore[no-untyped-def]
    g = Group(gid, len(episodes), 0.0)
    for e in episodes:
        g.members[e.episode_id] = e
    return g


@pytest.mark.timeout(10)
def test_per_episode_normalisation_weighs_episodes_equally() -> None:
    many = [transition(response=[4, 5, 6]) for _ in range(5)]  # 5 calls × 3 tokens
    one = [transition(response=[4])]
    g = _group("g", episode("g", 0, 1.0, transitions=many), episode("g", 1, 0.0, transitions=one))
    batch = build_batch([g], AlgorithmConfig(), current_version=0)
    per_episode: dict[str, float] = {}
    for s in batch.samples:
        per_episode[s.episode_id] = per_episode.get(s.episode_id, 0.0) + s.token_weight * s.response_tokens
    assert list(per_episode.values()) == pytest.approx([0.5, 0.5])
    assert batch.stats.transitions_per_episode == pytest.approx(3.0)
    assert batch.stats.success_rate == pytest.approx(0.5)


@pytest.mark.timeout(10)
def test_observation_tokens_are_masked_out() -> None:
    t = transition(response=[4, 5, 6, 7], mask=[1, 0, 0, 1])
    g = _group("g", episode("g", 0, 1.0, transitions=[t]), episode("g", 1, 0.0))
    batch = build_batch([g], AlgorithmConfig(), 0)
    assert batch.samples[0].response_tokens == 2
    assert batch.samples[0].token_weight == pytest.approx(1 / (2 * 2))
    # in the loss, a masked position gets no gradient whatever its logprob
    logp = torch.zeros(1, 4, requires_grad=True)
    weights = torch.tensor([[0.25, 0.0, 0.0, 0.25]])
    parts = policy_loss(logp, logp.detach(), torch.zeros(1, 4), torch.ones(1, 4), weights, AlgorithmConfig())
    parts.loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 0] != 0
    assert parts.tokens == 2


@pytest.mark.timeout(10)
def test_truncated_importance_weights_and_clipping() -> None:
    cfg = AlgorithmConfig(behaviour_weight="truncated", tis_cap=2.0, clip_low=0.2, clip_high=0.2)
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.1, 1.0]]))  # IS = 1, 5 (capped to 2), 0.5
    logp = (old + torch.log(torch.tensor([[1.0, 1.5, 1.0]]))).requires_grad_(True)  # ratio 1, 1.5, 1
    weights = torch.ones(1, 3)
    adv = torch.ones(1, 3)
    parts = policy_loss(logp, old, behaviour, adv, weights, cfg)
    assert parts.tis_capped_tokens == 1
    assert parts.tis_sum == pytest.approx(1 + 2 + 0.5)
    assert parts.clipped_tokens == 1  # ratio 1.5 > 1.2 with positive advantage
    parts.loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert logp.grad[0, 1] == 0  # clipped: no gradient
    assert logp.grad[0, 0] == pytest.approx(-1.0)  # -A * ratio * IS
    assert logp.grad[0, 2] == pytest.approx(-0.5)
    no_tis = policy_loss(logp.detach(), old, behaviour, adv, weights, AlgorithmConfig(tis_cap=None))
    assert no_tis.tis_sum == 3


@pytest.mark.timeout(10)
def test_kl_k3_is_zero_at_reference_and_positive_elsewhere() -> None:
    cfg = AlgorithmConfig(kl_coef=0.5)
    logp = torch.log(torch.tensor([[0.3, 0.6]]))
    zero_adv = torch.zeros(1, 2)
    same = policy_loss(logp, logp, logp, zero_adv, torch.ones(1, 2), cfg, ref_logp=logp)
    assert same.kl_sum == pytest.approx(0.0, abs=1e-7)
    other = policy_loss(logp, logp, logp, zero_adv, torch.ones(1, 2), cfg, ref_logp=logp - 0.3)
    assert other.kl_sum > 0
    assert other.loss.item() == pytest.approx(0.5 * other.kl_sum, rel=1e-5)


@pytest.mark.timeout(10)
def test_staleness_drop_and_downweight() -> None:
    fresh = transition(version=9)
    stale = transition(version=2)
    g = _group(
        "g",
        episode("g", 0, 1.0, transitions=[fresh, stale]),
        episode("g", 1, 0.0, transitions=[stale], source=EpisodeSource.replay),
    )
    drop = build_batch([g], AlgorithmConfig(max_staleness=4, stale_policy="drop"), current_version=10)
    assert len(drop.samples) == 1 and drop.samples[0].weight_version == 9
    assert drop.stats.skipped["stale_transition"] == 2
    assert drop.stats.skipped["stale_episode"] == 1
    assert drop.stats.staleness_max == 8
    down = build_batch(
        [g], AlgorithmConfig(max_staleness=4, stale_policy="downweight", stale_decay=0.5), current_version=10
    )
    assert len(down.samples) == 3
    by_version = {(s.episode_id, s.weight_version): s.token_weight for s in down.samples}
    # episode 0: 4 tokens, fresh factor 1, stale factor 0.5**4
    assert by_version[("g-e0-a0", 9)] == pytest.approx(1 / (2 * 4))
    assert by_version[("g-e0-a0", 2)] == pytest.approx(0.5**4 / (2 * 4))
    assert down.stats.replay_episodes == 1


@pytest.mark.timeout(10)
def test_stale_transitions_train_by_default_and_exclusions_are_figures() -> None:
    stale = transition(version=2)
    g = _group("g", episode("g", 0, 1.0, transitions=[stale]), episode("g", 1, 0.0, transitions=[stale]))
    flat = _group("flat", episode("flat", 0, 1.0), episode("flat", 1, 1.0))
    batch = build_batch([g, flat], AlgorithmConfig(), current_version=1_000)
    assert AlgorithmConfig().stale_policy == "weight"
    assert len(batch.samples) == 2 and batch.stats.staleness_max == 998  # a thousand versions late: trained
    assert all(s.token_weight == pytest.approx(1 / (2 * 2)) for s in batch.samples)  # not decayed
    figures = batch.stats.as_metrics()
    assert figures["excluded_no_signal"] == 2.0  # the flat group's two episodes, by its stated rule
    assert not any(k.startswith("excluded_stale") for k in figures)


@pytest.mark.timeout(10)
def test_m2_mask_leaves_out_the_tokens_furthest_from_the_behaviour_policy() -> None:
    from trainer.loss import m2_keep

    m2 = torch.tensor([[0.0, 0.01, 1.0, 0.02], [0.5, 0.0, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # the mean over the response tokens is 1.53/7 > 0.04: the two largest go, the rest average 0.006
    assert m2_keep(m2, mask, 0.04).tolist() == [[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
    assert m2_keep(m2, mask, 10.0).tolist() == mask.tolist()  # within the region: nothing masked
    # in the loss: a token masked out gets no gradient, and the masked share is reported
    logp = torch.full((1, 4), -1.0, requires_grad=True)
    behaviour = torch.tensor([[-1.0, -1.0, -4.0, -1.0]])  # one token the policy has moved far from
    weights = torch.full((1, 4), 0.25)
    parts = policy_loss(
        logp, logp.detach(), behaviour, torch.ones(1, 4), weights, AlgorithmConfig(m2_threshold=0.04)
    )
    parts.loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 2].item() == 0.0 and all(logp.grad[0, i].item() != 0.0 for i in (0, 1, 3))
    assert parts.m2_masked_tokens == 1.0 and parts.m2_sum == pytest.approx(9.0)
    off = policy_loss(
        logp, logp.detach(), behaviour, torch.ones(1, 4), weights, AlgorithmConfig(m2_threshold=None)
    )
    assert off.m2_masked_tokens == 0.0


@pytest.mark.timeout(10)
def test_zero_variance_group_is_skipped_and_counted() -> None:
    flat = _group("flat", episode("flat", 0, 1.0), episode("flat", 1, 1.0))
    useful = _group("use", episode("use", 0, 1.0), episode("use", 1, 0.0))
    batch = build_batch([flat, useful], AlgorithmConfig(), 0)
    assert batch.stats.groups_zero_variance == 1
    assert {s.episode_id for s in batch.samples} == {"use-e0-a0", "use-e1-a0"}
    assert [s.advantage > 0 for s in batch.samples] == [True, False]


@pytest.mark.timeout(60)  # its first import of trainer.loss may load torch's compiler stack (sympy)
def test_logprobs_are_of_each_rows_sampling_temperature() -> None:
    """Row i is log_softmax(logits / T_i): the distribution the engine sampled it from."""
    from trainer.loss import gather_logprobs

    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0)) * 4
    targets = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([1.0, 0.7, 1.3])
    got = gather_logprobs(logits, targets, temperature)
    for i, t in enumerate(temperature.tolist()):
        want = torch.log_softmax(logits[i] / t, -1).gather(-1, targets[i].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(got[i], want)
    torch.testing.assert_close(
        gather_logprobs(logits, targets), gather_logprobs(logits, targets, torch.ones(3))
    )
    assert not torch.allclose(got[1], gather_logprobs(logits, targets)[1])


@pytest.mark.timeout(60)
def test_a_transitions_temperature_reaches_its_sample_and_verl_refuses_a_mix() -> None:
    from trainer.backends.base import BackendError
    from trainer.backends.verl_convert import batch_temperature

    warm = transition().model_copy(update={"temperature": 0.7})
    g = _group(
        "g", episode("g", 0, 1.0, transitions=[warm]), episode("g", 1, 0.0, transitions=[transition()])
    )
    samples = build_batch([g], AlgorithmConfig(), current_version=0).samples
    assert sorted(s.temperature for s in samples) == [0.7, 1.0]
    assert batch_temperature(samples[:1]) == samples[0].temperature and batch_temperature([]) == 1.0
    with pytest.raises(BackendError, match="mixes"):
        batch_temperature(samples)


@pytest.mark.timeout(10)
def test_tapered_weights_follow_good_samples_and_cap_bad_ones_at_one() -> None:
    """TOPR (the default): a positive advantage's tokens weigh 1 however far the policy moved from μ; a
    negative one's weigh min(π_old/μ, 1), so a stale failure cannot push down what the policy left."""
    logp = torch.tensor([[-3.0, -0.5, -3.0, -0.5]], requires_grad=True)
    behaviour = torch.tensor([[-0.5, -3.0, -0.5, -3.0]])  # μ: tokens 0 and 2 likelier, 1 and 3 less
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    weights = torch.full((1, 4), 0.25)
    parts = policy_loss(logp, logp.detach(), behaviour, adv, weights, AlgorithmConfig())
    parts.loss.backward()
    assert logp.grad is not None
    grad = logp.grad[0].tolist()
    # d loss / d logp = -A · w · weight: positives w = 1 both; the negative the policy left w = e^-2.5
    assert grad[0] == pytest.approx(-0.25) and grad[1] == pytest.approx(-0.25)
    assert grad[2] == pytest.approx(0.25 * math.exp(-2.5), rel=1e-4)
    assert grad[3] == pytest.approx(0.25)  # π_old/μ = e^2.5, capped at 1
    assert parts.tis_capped_tokens == 1.0


@pytest.mark.timeout(10)
def test_tapered_sequence_weighs_a_negative_sample_by_its_whole_response() -> None:
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -0.5, -0.5]])  # the response is e^-1 as likely under π_old as under μ
    weights = torch.full((1, 3), 1 / 3)
    cfg = AlgorithmConfig(behaviour_weight="tapered_sequence")
    negative = policy_loss(logp, logp.detach(), behaviour, torch.full((1, 3), -1.0), weights, cfg)
    assert negative.tis_sum == pytest.approx(3 * math.exp(-1.0), rel=1e-5)  # every token: e^-1
    positive = policy_loss(logp, logp.detach(), behaviour, torch.ones(1, 3), weights, cfg)
    assert positive.tis_sum == pytest.approx(3.0)
