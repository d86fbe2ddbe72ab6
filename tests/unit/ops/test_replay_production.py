"""Replayed production sessions: one predicate for "a production session, live or replayed", the copy's
``recorded_source``, the trainer's intake and batch taking a replayed session as a live one, the
selection filter, and the pacing that counts each session as one unit (without a store or a bus)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import schemas as s
from flywheel.cli.main import app
from flywheel.replay import ReplayFilter, ReplayReport, plan_replay
from flywheel.replay_pace import plan_steps
from trainer.baselines import ProductionBaselines
from trainer.batching import build_batch, is_production
from trainer.config import AlgorithmConfig
from trainer.groups import Group, Intake, is_production_session

pytestmark = pytest.mark.timeout(30)


def _transition(reward: float) -> s.Transition:
    return s.Transition(
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 1],
        behaviour_logprobs=[-0.5, -0.1],
        weight_version=0,
        reward=reward,
    )


def _session(i: int, reward: float, *, tenant: str = "acme") -> s.EpisodeScored:
    """A rated production session as the reward service publishes it: its own group of one."""
    eid = f"sess-{i}"
    return s.EpisodeScored(
        episode_id=eid,
        group_id=eid,
        source=s.EpisodeSource.production,
        tenant=tenant,
        reward=reward,
        reward_source="feedback",
        transitions=[_transition(reward)],
    )


def _live(group: str, i: int, reward: float) -> s.EpisodeScored:
    return s.EpisodeScored(
        episode_id=f"{group}-{i}",
        group_id=group,
        group_size=2,
        sample_index=i,
        reward=reward,
        reward_source="exact",
        transitions=[_transition(reward)],
    )


def test_the_predicate_names_live_and_replayed_production_sessions() -> None:
    live_session = _session(0, 1.0)
    replayed = live_session.model_copy(
        update={"source": s.EpisodeSource.replay, "recorded_source": s.EpisodeSource.production}
    )
    assert is_production_session(live_session) and is_production_session(replayed)
    assert not is_production_session(_live("g", 0, 1.0))
    for recorded in (s.EpisodeSource.live, None):
        other = replayed.model_copy(update={"recorded_source": recorded})
        assert not is_production_session(other)
    # the field is optional: an event written before it decodes, and means "not recorded elsewhere"
    old = s.EpisodeScored.model_validate_json(live_session.model_dump_json(exclude={"recorded_source"}))
    assert old.recorded_source is None


def test_plan_replay_keeps_the_recorded_source_and_a_group_per_session() -> None:
    # two sessions that (wrongly) share a group id still replay as two groups of one
    events = [
        _session(0, 1.0),
        _session(1, 0.0).model_copy(update={"group_id": "sess-0"}),
        _live("g", 0, 1.0),
    ]
    report = ReplayReport(run_id="run1")
    planned = plan_replay(events, run_id="run1", report=report)
    by_id = {e.episode_id: e for e in planned}
    assert by_id["sess-0"].recorded_source == by_id["sess-1"].recorded_source == s.EpisodeSource.production
    assert by_id["g-0"].recorded_source == s.EpisodeSource.live
    assert {e.source for e in planned} == {s.EpisodeSource.replay}
    assert by_id["sess-0"].group_id != by_id["sess-1"].group_id
    assert by_id["sess-1"].group_size == 1 and by_id["sess-1"].tenant == "acme"
    assert by_id["sess-1"].reward_source == "feedback"  # the baseline's key survives the copy
    assert report.production == 2 and report.groups == 3
    assert report.flat_groups == 1  # the lone live member; sessions are not "flat groups"
    # a replay of a replay still knows it was production traffic
    again = plan_replay([by_id["sess-0"]], run_id="run2", report=ReplayReport())
    assert again[0].recorded_source == s.EpisodeSource.production and is_production_session(again[0])


def test_the_trainer_takes_a_replayed_session_as_a_live_one() -> None:
    planned = plan_replay(
        [_session(i, r) for i, r in enumerate([1.0, 0.0, 1.0])], run_id="r", report=ReplayReport()
    )
    intake = Intake()
    assert [intake.add(e) for e in planned] == [None, None, None]
    assert intake.pending_groups == 0 and intake.production_waiting == 3  # they wait alone
    groups = intake.take_production(10)
    assert [len(g.episodes()) for g in groups] == [1, 1, 1] and all(is_production(g) for g in groups)
    baselines = ProductionBaselines()
    cfg = AlgorithmConfig()
    batch = build_batch(groups, cfg, 0, baselines=baselines)
    advantages = {smp.episode_id: smp.advantage for smp in batch.samples}
    assert advantages["sess-0"] == advantages["sess-2"] > 0 > advantages["sess-1"]
    assert batch.stats.production_episodes == 3 and batch.stats.samples_by_source["replay"] == 3
    baselines.update(batch.production, cfg)
    assert baselines.stats["acme|feedback"].count == 3  # the tenant's baseline, as for live sessions
    # a replayed live episode of one is still a group member waiting for its group
    live_copy = plan_replay([_live("g", 0, 1.0)], run_id="r", report=ReplayReport())[0]
    assert intake.add(live_copy.model_copy(update={"group_size": 2})) is None
    assert intake.pending_groups == 1 and intake.production_waiting == 0
    assert not is_production(Group(live_copy.group_id, 2, 0.0, {live_copy.episode_id: live_copy}))


def test_pacing_counts_each_session_as_one_unit_in_completion_order() -> None:
    log = [
        _session(0, 1.0),
        _live("flat", 0, 1.0),
        _session(1, 1.0),
        _live("flat", 1, 1.0),
        _session(2, 0.0),
        _session(3, 1.0),
        _live("g", 0, 1.0),
        _live("g", 1, 0.0),
        _session(4, 0.0),
    ]
    planned = plan_replay(log, run_id="p", report=ReplayReport())
    plan = plan_steps(log, planned, 2)
    order = [[m.episode_id for g in step for m in g] for step in plan.steps]
    # the flat live group is left out; every session, rated alike or not, is one unit
    assert order == [["sess-0", "sess-1"], ["sess-2", "sess-3"], ["g-0", "g-1", "sess-4"]]
    assert plan.no_signal == 2 and plan.production == 5
    # step 1: a new tenant's first two sessions, both rated up, are their own baseline: no step comes
    # from the trainer for it (the replay does not wait for one); later steps move against the baseline
    assert plan.trains == [False, True, True]


def test_the_source_filter_selects_in_the_event_log_and_is_shown() -> None:
    assert ReplayFilter(source="production").to_episode_filter().source == "production"
    assert ReplayFilter().to_episode_filter().source is None
    result = CliRunner().invoke(app, ["replay", "--source", "staging", "--dry-run"])
    assert result.exit_code == 2 and "--source must be production, live or all" in result.output
