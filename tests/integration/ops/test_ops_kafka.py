"""The ops commands against the real Kafka broker: topics, doctor, status with lag, replay publishing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import schemas as s
from flywheel.cli.main import app
from infra.bus.base import Message
from infra.bus.kafka import KafkaBus
from infra.eventlog.store import ChdbStore
from tests.integration.ops.synthetic import synthetic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def recorded_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ops-kafka")
    store = ChdbStore(root / "chdb")
    try:
        store.migrate()
        store.insert(synthetic_run().events)
    finally:
        store.close()
    yield root


@pytest.fixture
def kafka_cli(
    recorded_dir: Path, kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> CliRunner:
    for name in ("FLYWHEEL_ADMIN_URL", "FLYWHEEL_CLICKHOUSE_URL", "FLYWHEEL_ENV", "FLYWHEEL_GATEWAY_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_BUS", "kafka")
    monkeypatch.setenv("FLYWHEEL_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("FLYWHEEL_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(recorded_dir))
    return CliRunner()


def _invoke(cli: CliRunner, *args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


async def test_topics_doctor_status_and_replay_on_kafka(
    kafka_cli: CliRunner, kafka_bootstrap: str, topic_prefix: str
) -> None:
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["kafka"]["level"] == "fail" and "flywheel topics create" in checks["kafka"]["fix"]

    code, out = await asyncio.to_thread(_invoke, kafka_cli, "topics", "create", "--pool", "gpu", "--json")
    assert code == 0, out
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "topics", "ls", "--json")
    assert code == 0, out
    topics = {t["topic"]: t for t in json.loads(out)["topics"]}
    assert set(topics) == {*s.TOPICS, "flywheel.tasks.gpu"}
    assert topics["flywheel.episodes"]["partitions"] == 16
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["kafka"]["level"] == "ok"

    received: list[s.EpisodeScored] = []
    done = asyncio.Event()

    async def collect(message: Message) -> None:
        assert isinstance(message.event, s.EpisodeScored)
        received.append(message.event)
        if len(received) >= 8:
            done.set()

    bus = KafkaBus(kafka_bootstrap, prefix=topic_prefix)
    await bus.start()
    sub = await bus.subscribe(s.TRANSITIONS, "ops-test-trainer", collect)
    try:
        code, out = await asyncio.to_thread(
            _invoke, kafka_cli, "replay", "--since", "1d", "--rate", "200/s", "--no-pace", "--json"
        )
        assert code == 0, out
        report = json.loads(out)
        assert report["sent"] == 8 and report["skipped"]["no_logprobs"] == 1
        async with asyncio.timeout(30):
            await done.wait()
    finally:
        await sub.stop()
        await bus.stop()
    assert {e.source for e in received} == {s.EpisodeSource.replay}
    assert all(e.transitions and e.transitions[0].behaviour_logprobs for e in received)

    # Nothing consumes as the trainer's group here: status shows the lag and says the services are down.
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "status", "--json", "--timeout", "3")
    status = json.loads(out)
    assert code == 1
    assert status["topics"]["flywheel.transitions"]["trainer"] == 8
    assert "trainer: no live consumer in group 'trainer'" in status["problems"]


async def test_trainer_pause_and_resume_travel_on_the_control_topic(kafka_cli: CliRunner) -> None:
    """`flywheel trainer pause|resume` on Kafka: one control event each, which `flywheel status` reads back
    (the trainer's reaction to the same events: tests/integration/trainer/test_trainer_service.py)."""
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "topics", "create")
    assert code == 0, out

    async def pause_requested() -> object:
        _, out = await asyncio.to_thread(_invoke, kafka_cli, "status", "--json", "--timeout", "3")
        return json.loads(out)["control"]["trainer_pause_requested"]

    code, out = await asyncio.to_thread(_invoke, kafka_cli, "trainer", "pause", "--reason", "maintenance")
    assert code == 0 and "trainer pause requested (Kafka at " in out, out
    assert await pause_requested() == "maintenance"
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "trainer", "resume")
    assert code == 0, out
    assert await pause_requested() is None


async def test_trainer_pause_names_an_unreachable_broker(
    kafka_cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    code, out = await asyncio.to_thread(_invoke, kafka_cli, "trainer", "pause")
    assert code == 1 and out.startswith("error: Kafka at 127.0.0.1:1") and out.count("\n") == 1, out
