"""Replay's parsing and planning, without a store or a bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import schemas as s
from flywheel.cli.eventlog_opts import parse_rate, parse_time, parse_weight_versions
from flywheel.replay import ReplayFilter, ReplayFilterError, ReplayReport, plan_replay, skip_reason

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_parse_time_forms() -> None:
    assert parse_time("2026-11-30", now=NOW) == datetime(2026, 11, 30, tzinfo=UTC)
    assert parse_time("2026-11-30T10:15Z", now=NOW) == datetime(2026, 11, 30, 10, 15, tzinfo=UTC)
    assert parse_time("2026-11-30T10:15+02:00", now=NOW) == datetime(2026, 11, 30, 8, 15, tzinfo=UTC)
    assert parse_time("2h", now=NOW) == NOW - timedelta(hours=2)
    assert parse_time("7d", now=NOW) == NOW - timedelta(days=7)
    assert parse_time("now", now=NOW) == NOW


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01", "", "5 parsecs", "-2h"])
def test_parse_time_rejects(bad: str) -> None:
    with pytest.raises(ReplayFilterError, match="as a time"):
        parse_time(bad, now=NOW)


def test_parse_weight_versions() -> None:
    assert parse_weight_versions("3") == (3, 3)
    assert parse_weight_versions("2..5") == (2, 5)
    assert parse_weight_versions("..5") == (None, 5)
    assert parse_weight_versions("2..") == (2, None)
    for bad in ("x", "5..2", "-1", "..", "1..b"):
        with pytest.raises(ReplayFilterError):
            parse_weight_versions(bad)


def test_parse_rate() -> None:
    assert parse_rate("20") == 20.0
    assert parse_rate("20/s") == 20.0
    assert parse_rate("600/m") == 10.0
    for bad in ("0", "-5/s", "fast", "nan", "inf"):
        with pytest.raises(ReplayFilterError):
            parse_rate(bad)


def test_filter_cross_checks_are_one_line_errors() -> None:
    with pytest.raises(ReplayFilterError, match="since must be before until"):
        ReplayFilter(since=NOW, until=NOW - timedelta(hours=1)).to_episode_filter()
    assert ReplayFilter(task_pattern="sql_*").to_episode_filter().task_id_like == "sql\\_%"


def _scored(group: str, reward: float | None = 1.0, **kw: object) -> s.EpisodeScored:
    t = s.Transition(
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 1],
        behaviour_logprobs=[-0.5, -0.1],
        weight_version=2,
    )
    fields: dict[str, object] = {"transitions": [t], "reward": reward, **kw}
    return s.EpisodeScored(episode_id=s.new_episode_id(), group_id=group, group_size=4, **fields)  # type: ignore[arg-type]


def test_skip_reasons() -> None:
    assert skip_reason(_scored("g")) is None
    assert skip_reason(_scored("g", transitions=[], unusable_reason="no_calls")) == "no_transitions:no_calls"
    assert skip_reason(_scored("g", mode=s.Mode.val)) == "not_train"
    assert skip_reason(_scored("g", superseded=True)) == "superseded"
    assert skip_reason(_scored("g", reward=None)) == "no_reward"
    no_lp = s.Transition(prompt_ids=[1], response_ids=[3], response_mask=[1], behaviour_logprobs=[])
    assert skip_reason(_scored("g", transitions=[no_lp])) == "no_logprobs"
    short = s.Transition(prompt_ids=[1], response_ids=[3, 4], response_mask=[1, 1], behaviour_logprobs=[-1.0])
    assert skip_reason(_scored("g", transitions=[short])) == "logprobs_length"


def test_plan_regroups_and_renumbers() -> None:
    events = [_scored("a", 1.0), _scored("b", 0.0), _scored("a", 0.0), _scored("a", None), _scored("c", 1.0)]
    report = ReplayReport(run_id="abcd1234")
    planned = plan_replay(events, run_id="abcd1234", report=report)
    assert report.selected == 5 and report.skipped == {"no_reward": 1} and report.groups == 3
    assert report.flat_groups == 2  # b and c have one member each
    by_group: dict[str, list[s.EpisodeScored]] = {}
    for e in planned:
        by_group.setdefault(e.group_id, []).append(e)
    assert set(by_group) == {"rabcd1234-a", "rabcd1234-b", "rabcd1234-c"}
    assert [e.sample_index for e in by_group["rabcd1234-a"]] == [0, 1]
    assert all(e.group_size == len(by_group[e.group_id]) for e in planned)
    originals = {e.episode_id: e for e in events}
    for e in planned:
        o = originals[e.episode_id]
        assert e.source == s.EpisodeSource.replay and e.producer == "replay"
        assert e.event_id != o.event_id and e.transitions == o.transitions
    long_group = "x" * 64
    planned = plan_replay([_scored(long_group)], run_id="abcd1234", report=ReplayReport())
    assert len(planned[0].group_id) == 64  # still a valid group id
