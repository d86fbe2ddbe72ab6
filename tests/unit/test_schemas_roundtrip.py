"""Every event survives a JSON round trip and decodes only on its own topic."""

from __future__ import annotations

import pytest

import schemas as s
from tests.fixtures.events import sample_events


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: e.type)
def test_json_roundtrip(event: s.AnyEvent) -> None:
    topic = s.topic_for(event)
    decoded = s.decode(topic, s.encode(event))
    assert decoded == event
    assert s.spec_for(topic).event_types >= {type(event)}


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: e.type)
def test_wrong_topic_is_rejected(event: s.AnyEvent) -> None:
    other = s.TRANSITIONS if s.topic_for(event) != s.TRANSITIONS else s.CONTROL
    with pytest.raises(s.EventDecodeError):
        s.decode(other, s.encode(event))


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(s.EventDecodeError):
        s.decode(s.EPISODES, b"\xff\x00not json")


def test_ids_are_unique_and_unguessable_shape() -> None:
    ids = {s.new_episode_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(s.is_valid_episode_id(i) for i in ids)
    assert not s.is_valid_episode_id("../etc/passwd")
    events = [s.new_event_id() for _ in range(1000)]
    assert len(set(events)) == 1000


def test_step_metrics_are_typed_and_keep_the_flat_wire_shape() -> None:
    """``TrainerStepCompleted.metrics`` reads and writes the flat ``{name: number}`` object it always was:
    a figure the step did not report stays absent (not 0), an algorithm's own figure is an extra number,
    and a figure that is not a number is a decode error."""
    wire = b'{"type":"trainer_step_completed","step":3,"version":2,"metrics":{"reward":0.25,"sft_loss":1}}'
    event = s.decode(s.CONTROL, wire)
    assert isinstance(event, s.TrainerStepCompleted)
    assert event.metrics.reward == 0.25 and event.metrics.kl is None
    assert event.metrics.get("sft_loss") == 1.0 and event.metrics.get("value_loss") is None
    assert event.metrics.as_dict() == {"reward": 0.25, "sft_loss": 1.0}
    again = s.decode(s.CONTROL, s.encode(event))
    assert isinstance(again, s.TrainerStepCompleted)
    assert again.metrics.as_dict() == {"reward": 0.25, "sft_loss": 1.0}
    assert event.metrics.updated({"kl": 0.5}).as_dict() == {"reward": 0.25, "sft_loss": 1.0, "kl": 0.5}
    with pytest.raises(s.EventDecodeError):
        s.decode(s.CONTROL, wire.replace(b'"sft_loss":1', b'"sft_loss":"high"'))
