"""Grouping, dedupe, retries, malformed episodes, and group deadlines."""

from __future__ import annotations

import pytest

from schemas import EpisodeStatus, Mode, Transition
from trainer.groups import Intake

from .helpers import VOCAB, episode, transition


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.timeout(10)
def test_group_completes_at_group_size_and_dedupes_event_ids() -> None:
    intake = Intake()
    e0 = episode("g", 0, 1.0, group_size=3)
    assert intake.add(e0) is None
    assert intake.add(e0) == "duplicate_event"
    assert intake.add(episode("g", 1, 0.0, group_size=3)) is None
    assert intake.ready() == []
    assert intake.add(episode("g", 2, 0.0, group_size=3)) is None
    [group] = intake.ready()
    assert len(group.members) == 3 and not group.expired
    # the group is consumed: a redelivery of any of its episodes is skipped
    assert intake.add(episode("g", 0, 1.0, group_size=3).model_copy(update={"event_id": "x" * 32})) == (
        "group_consumed"
    )
    assert intake.skipped == {"duplicate_event": 1, "group_consumed": 1}


@pytest.mark.timeout(10)
def test_retry_replaces_earlier_attempt_and_superseded_leaves() -> None:
    intake = Intake()
    failed = episode("g", 0, 0.0, group_size=2, status=EpisodeStatus.error)
    retry = episode("g", 0, 1.0, group_size=2, attempt=1)
    intake.add(failed)
    intake.add(retry)
    assert intake.skipped["superseded_attempt"] == 1
    # a late copy of attempt 0 (new event) does not come back
    late = failed.model_copy(update={"event_id": "late" + "0" * 28, "episode_id": "other"})
    assert intake.add(late) == "older_attempt"
    extra = episode("g", 1, 0.0, group_size=2)
    gone = extra.model_copy(update={"event_id": "s" * 32, "superseded": True})
    intake.add(extra)
    assert intake.add(gone) == "superseded"
    assert intake.ready() == []  # member 1 left the group: not complete
    intake.add(episode("g", 2, 0.0, group_size=2))
    [group] = intake.ready()
    assert {e.episode_id for e in group.episodes()} == {retry.episode_id, "g-e2-a0"}


@pytest.mark.timeout(10)
def test_malformed_and_non_training_episodes_are_counted_not_raised() -> None:
    intake = Intake(vocab_size=VOCAB)
    bad_mask = Transition.model_construct(
        prompt_ids=[1], response_ids=[2, 3], response_mask=[1], behaviour_logprobs=[-1.0, -1.0]
    )
    cases = {
        "malformed:mask_length": [bad_mask],
        "malformed:empty_response": [transition(response=[], mask=[])],
        "malformed:token_out_of_vocab": [transition(response=[VOCAB + 5])],
        "malformed:logprobs_values": [transition(logprob=float("nan"))],
        "malformed:empty_mask": [transition(mask=[0, 0])],
        "malformed:segments": [
            transition().model_copy(update={"segment_starts": [0, 1], "segment_returns": [1.0]})
        ],
    }
    for i, (reason, ts) in enumerate(cases.items()):
        ep = episode(f"g{i}", 0, 1.0).model_copy(update={"transitions": ts})
        assert intake.add(ep) == reason
    assert intake.add(episode("v", 0, 1.0, mode=Mode.val)) == "not_train"
    assert sum(intake.skipped.values()) == len(cases) + 1
    assert intake.pending_groups == 0


@pytest.mark.timeout(10)
def test_deadline_trains_partial_or_drops_by_policy() -> None:
    clock = Clock()
    train = Intake(group_timeout_s=10, partial="train", min_partial=2, clock=clock)
    drop = Intake(group_timeout_s=10, partial="drop", clock=clock)
    for intake in (train, drop):
        intake.add(episode("g", 0, 1.0, group_size=4))
        intake.add(episode("g", 1, 0.0, group_size=4))
    clock.now = 5
    assert train.ready() == [] and drop.ready() == []
    assert train.next_deadline_in() == pytest.approx(5)
    clock.now = 10.5
    [partial] = train.ready()
    assert partial.expired and len(partial.members) == 2
    assert drop.ready() == [] and drop.dropped_groups["deadline"] == 1
    assert "g" in drop.consumed
    # too few rewarded members: dropped even when partial groups are trained
    lonely = Intake(group_timeout_s=1, partial="train", min_partial=2, clock=clock)
    lonely.add(episode("h", 0, 1.0, group_size=4))
    clock.now = 20
    assert lonely.ready() == [] and lonely.dropped_groups["deadline"] == 1


@pytest.mark.timeout(10)
def test_consumed_groups_are_bounded_oldest_out() -> None:
    """Every trained group's id is kept to skip its late episodes: at most ``seen_capacity`` of them."""
    intake = Intake(seen_capacity=3, consumed=["old"])
    for i in range(5):
        assert intake.add(episode(f"g{i}", 0, 1.0, group_size=1)) is None
        intake.ready()
    assert intake.consumed == {"g2", "g3", "g4"}
    intake.mark_consumed(["g4", "g5"])  # again and new
    assert intake.consumed == {"g3", "g4", "g5"}
    # a checkpoint keeps them oldest first, so a trainer restored from it forgets the same ones first
    assert intake.consumed_ids() == ["g3", "g4", "g5"]
    assert intake.consumed_ids(excluding={"g4"}) == ["g3", "g5"]
    restored = Intake(seen_capacity=3, consumed=intake.consumed_ids())
    restored.mark_consumed(["g6"])
    assert restored.consumed_ids() == ["g4", "g5", "g6"]
