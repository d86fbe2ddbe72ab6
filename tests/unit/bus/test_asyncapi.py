"""``docs/asyncapi.json`` is what faststream writes of schemas.TOPICS today, and ``flywheel topics asyncapi``
prints it."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.bus import asyncapi
from schemas import TOPICS

pytestmark = pytest.mark.timeout(60)

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "asyncapi.json"


def test_the_committed_document_is_current() -> None:
    """Fails when an event or topic changes without ``flywheel topics asyncapi --out docs/asyncapi.json``."""
    assert asyncapi.render(version("flywheel")) == COMMITTED.read_text()


def test_every_topic_is_a_channel_carrying_its_events() -> None:
    doc = asyncapi.document("0")
    assert doc["asyncapi"] == "3.0.0"
    assert set(doc["channels"]) == set(TOPICS)
    schemas = doc["components"]["schemas"]
    for name, spec in TOPICS.items():
        assert f"Key: {spec.key_field}; partitions: {spec.partitions}" in doc["channels"][name]["description"]
        for event in spec.event_types:
            assert event.__name__ in schemas, (name, event.__name__)
    # the payload is the topic's discriminated union, not one event
    payload = schemas["flywheel.episodes:Message:Payload"]
    assert payload["discriminator"] == "type"
    assert len(payload["oneOf"]) == len(TOPICS["flywheel.episodes"].event_types)


def test_a_topic_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        asyncapi, "PURPOSE", {k: v for k, v in asyncapi.PURPOSE.items() if k != "flywheel.agl"}
    )
    with pytest.raises(ValueError, match=r"flywheel\.agl"):
        asyncapi.document("0")


def test_the_cli_prints_and_writes_the_document(tmp_path: Path) -> None:
    runner = CliRunner()
    printed = runner.invoke(app, ["topics", "asyncapi"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout)["info"]["title"] == "Flywheel"
    assert printed.stdout == COMMITTED.read_text()
    written = runner.invoke(app, ["topics", "asyncapi", "--out", str(tmp_path / "a.json")])
    assert written.exit_code == 0, written.output
    assert (tmp_path / "a.json").read_text() == printed.stdout
    refused = runner.invoke(app, ["topics", "asyncapi", "--out", str(tmp_path)])
    assert refused.exit_code == 2
    assert "is a directory" in refused.output
