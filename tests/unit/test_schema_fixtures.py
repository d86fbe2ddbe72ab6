"""Data written by earlier schema versions must keep decoding.

``tests/fixtures/events_v1.jsonl`` was written by schema version 1 and is committed; it is never
regenerated. A change that breaks it breaks stored data: bump SCHEMA_VERSION, add a migration, and
add a new fixture file beside this one instead of editing it.
"""

from __future__ import annotations

from pathlib import Path

import schemas as s
from tests.fixtures.events import sample_events

FIXTURE = Path(__file__).parent.parent / "fixtures" / "events_v1.jsonl"


def test_v1_fixture_covers_every_event_type() -> None:
    lines = FIXTURE.read_text().splitlines()
    decoded = [s.decode_any(line) for line in lines]
    every_type = {t for spec in s.TOPICS.values() for t in spec.event_types}
    assert {type(e) for e in decoded} == every_type


def test_v1_fixture_still_equals_current_models() -> None:
    decoded = [s.decode_any(line) for line in FIXTURE.read_text().splitlines()]
    assert decoded == sample_events()
