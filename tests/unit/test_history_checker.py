"""tests/faults/history.py: a correct history passes, and each property fails on a history that breaks it."""

from __future__ import annotations

import pytest

from schemas import EPISODES, TRANSITIONS, EpisodeFinished, EpisodeScored, EpisodeStatus, LLMCallRecorded
from schemas import Transition as Sample
from tests.faults.history import Attempt, ClientCall, Logged, Violation, check

pytestmark = pytest.mark.timeout(30)

OK = (Attempt(200),)


def _call(ep: str, seq: int, call_id: str | None = None) -> Logged:
    event = LLMCallRecorded(episode_id=ep, call_seq=seq, call_id=call_id or f"{ep}-{seq}", request="{}")
    return Logged(event, EPISODES, 0, 0)


def _finished(ep: str, superseded: bool = False) -> Logged:
    return Logged(EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, superseded=superseded), EPISODES)


def _scored(ep: str, calls: int, offset: int, revision: int = 0, partition: int = 0) -> Logged:
    sample = Sample(prompt_ids=[1], response_ids=[2], response_mask=[1], behaviour_logprobs=[-0.5])
    event = EpisodeScored(
        episode_id=ep, group_id="g", num_calls=calls, transitions=[sample], score_revision=revision
    )
    return Logged(event, TRANSITIONS, partition, offset)


def _history() -> tuple[list[Logged], list[ClientCall]]:
    """Two episodes of two calls each, finished, scored at offsets 0 and 1 of partition 0."""
    logged = [_call("a", 0), _call("a", 1), _call("b", 0), _call("b", 1)]
    logged += [_finished("a"), _finished("b"), _scored("a", 2, 0), _scored("b", 2, 1)]
    client = [ClientCall(ep, OK) for ep in ("a", "a", "b", "b")]
    return logged, client


def _rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def test_a_correct_history_has_no_violation_and_redelivered_records_count_once() -> None:
    logged, client = _history()
    violations, figures = check(logged + logged[:3], client, {0: 2})  # redelivered: same event ids
    assert violations == []
    assert (figures.calls_recorded, figures.duplicate_records, figures.episodes_scored) == (4, 3, 2)


def test_a_call_recorded_twice_under_two_event_ids_is_found() -> None:
    logged, client = _history()
    violations, _ = check([*logged, _call("a", 1)], client, {0: 2})  # a new event id, same call id
    assert _rules(violations) == {"call-recorded-once"}


def test_an_answered_call_missing_from_the_log_is_found() -> None:
    logged, client = _history()
    violations, _ = check(logged, [*client, ClientCall("b", OK)], {0: 2})
    assert violations == [Violation("call-recorded-once", "b", "3 calls answered 2xx, 2 recorded")]


def test_two_calls_with_one_call_number_are_found() -> None:
    logged, client = _history()
    logged[1] = _call("a", 0, call_id="a-other")
    violations, _ = check(logged, client, {0: 2})
    assert _rules(violations) == {"call-seq-unique"}


def test_a_finished_episode_never_scored_is_found_unless_superseded() -> None:
    logged, client = _history()
    unscored = [r for r in logged if not (isinstance(r.event, EpisodeScored) and r.event.episode_id == "b")]
    violations, _ = check(unscored, client, {0: 2})
    assert violations == [Violation("scored-once", "b", "finished, never scored")]
    superseded = [
        r if r.event.type != "episode_finished" or r.event.episode_id != "b" else _finished("b", True)
        for r in unscored
    ]
    assert check(superseded, client, {0: 2})[0] == []


def test_one_score_revision_published_twice_is_found_and_a_rescore_is_not() -> None:
    logged, client = _history()
    twice, _ = check([*logged, _scored("a", 2, 2)], client, {0: 3})
    assert _rules(twice) == {"scored-once"}
    rescored, _ = check([*logged, _scored("a", 2, 2, revision=1)], client, {0: 3})
    assert rescored == []


def test_an_episode_scored_from_part_of_its_calls_is_found() -> None:
    logged, client = _history()
    logged[-1] = _scored("b", 1, 1)
    violations, _ = check(logged, client, {0: 2})
    assert violations == [Violation("scored-from-all-calls", "b", "scored from 1 calls, 2 recorded")]


def test_transitions_the_trainer_has_not_reached_are_found() -> None:
    logged, client = _history()
    violations, _ = check(logged, client, {0: 1})
    assert [(v.rule, v.episode_id) for v in violations] == [("transitions-trained", "b")]
    assert check(logged, client, None)[0] == []  # no trainer in the run: not checked


def test_a_5xx_outside_the_retry_path_is_found() -> None:
    logged, client = _history()
    retried = [ClientCall("a", (Attempt(503, retry_after=True), Attempt(0), Attempt(200))), *client[1:]]
    assert check(logged, retried, {0: 2})[0] == []
    bare_500 = [ClientCall("a", (Attempt(500), Attempt(200))), *client[1:]]
    assert _rules(check(logged, bare_500, {0: 2})[0]) == {"no-5xx"}
    gave_up = [ClientCall("a", (Attempt(503, retry_after=True),)), *client[1:]]
    assert _rules(check(logged, gave_up, {0: 2})[0]) == {"no-5xx", "call-recorded-once"}
