"""Production sessions at the intake and in the batch: re-scores, missing rewards, running baselines."""

from __future__ import annotations

import pytest

from schemas import EpisodeScored, EpisodeSource
from trainer.baselines import ProductionBaselines
from trainer.batching import build_batch
from trainer.config import AlgorithmConfig
from trainer.groups import Group, Intake

from .helpers import episode, transition


def session(i: int, reward: float | None, revision: int = 0, tenant: str = "t") -> EpisodeScored:
    eid = f"s{i}"
    return EpisodeScored(
        event_id=f"scored-{eid}",  # the reward service's id does not change with the revision
        episode_id=eid,
        group_id=eid,
        source=EpisodeSource.production,
        tenant=tenant,
        reward=reward,
        reward_source="feedback",
        score_revision=revision,
        transitions=[transition(reward=reward or 0.0)],
        num_calls=1,
    )


@pytest.mark.timeout(10)
def test_rescore_replaces_an_untrained_score_and_is_skipped_once_trained() -> None:
    intake = Intake()
    assert intake.add(session(0, None)) == "no_reward"  # no feedback yet: counted, not buffered
    assert intake.add(session(0, 0.0, revision=1)) is None  # late feedback re-scores it
    assert intake.add(session(0, 1.0, revision=2)) is None
    assert intake.skipped["superseded_revision"] == 1
    assert intake.add(session(0, 0.0, revision=1)) == "duplicate_event"  # the same re-score again
    late = session(0, 0.0, revision=1).model_copy(update={"event_id": "other-id"})
    assert intake.add(late) == "older_revision"
    assert intake.ready() == []  # production sessions form no groups
    assert intake.production_waiting == 1
    [group] = intake.take_production(10)
    [taken] = group.episodes()
    assert taken.reward == 1.0 and taken.score_revision == 2
    assert intake.add(session(0, 0.0, revision=3)) == "rescore_after_trained"
    assert intake.production_waiting == 0


@pytest.mark.timeout(10)
def test_live_group_members_keep_their_highest_revision() -> None:
    intake = Intake()
    first = episode("g", 0, 0.0)
    rescored = first.model_copy(update={"event_id": "r" * 32, "reward": 1.0, "score_revision": 1})
    assert intake.add(rescored) is None
    assert intake.add(first.model_copy(update={"event_id": "f" * 32})) == "older_revision"
    intake.add(episode("g", 1, 0.0))
    [group] = intake.ready()
    assert group.members[first.episode_id].reward == 1.0


@pytest.mark.timeout(10)
def test_ema_baseline_and_batch_normalisation() -> None:
    cfg = AlgorithmConfig()
    baselines = ProductionBaselines()
    eps = [session(0, 1.0), session(1, 0.0), session(2, 1.0)]
    advs = [a for a, _ in baselines.advantages(eps, cfg)]
    # cold start: the step's own mean 2/3 and population std sqrt(2)/3
    assert advs == pytest.approx([0.5**0.5, -(2**0.5), 0.5**0.5])
    baselines.update(eps, cfg)
    stat = baselines.stats["t|feedback"]
    assert stat.mean == pytest.approx(2 / 3) and stat.count == 3
    # a single session now has a baseline; another tenant's first lone session has none
    [(lone, scale)] = baselines.advantages([session(3, 1.0)], cfg)
    assert lone == pytest.approx((1 - 2 / 3) / (2**0.5 / 3)) and scale == pytest.approx(2**0.5 / 3)
    assert baselines.advantages([session(4, 1.0, tenant="other")], cfg) == [(0.0, 0.1)]
    baselines.update([session(3, 1.0)], cfg)
    assert stat.mean == pytest.approx(2 / 3 + 0.1 * (1 - 2 / 3))
    restored = ProductionBaselines.from_json(baselines.to_json())
    assert restored.stats["t|feedback"].mean == pytest.approx(stat.mean)
    # REINFORCE++ global normalisation: the step's production rewards only
    batch_cfg = AlgorithmConfig(production_baseline="batch")
    batch_advs = [a for a, _ in ProductionBaselines().advantages(eps, batch_cfg)]
    assert batch_advs == pytest.approx(advs, rel=1e-4)
    assert ProductionBaselines().advantages([session(5, 1.0)], batch_cfg) == [(0.0, 1.0)]


@pytest.mark.timeout(10)
def test_build_batch_trains_production_sessions_and_counts_what_it_skips() -> None:
    intake = Intake()
    for i, r in enumerate([1.0, 0.0, 1.0]):
        intake.add(session(i, r))
    groups = intake.take_production(10)
    batch = build_batch(groups, AlgorithmConfig(), 0)
    assert len(batch.samples) == 3 and all(s.advantage != 0 for s in batch.samples)
    assert batch.stats.samples_by_source == {"production": 3}
    lone = build_batch(_taken(session(7, 1.0)), AlgorithmConfig(), 0)
    assert lone.samples == [] and lone.stats.skipped["production_no_signal"] == 1
    assert [e.episode_id for e in lone.production] == ["s7"]  # still the baseline's history


def _taken(event: EpisodeScored) -> list[Group]:
    intake = Intake()
    intake.add(event)
    return intake.take_production(10)
