"""``flywheel stats``: production feedback rate and thumbs-up rate over time, from really recorded events.

Three production sessions go through the real gateway (the ``openai`` SDK, a tenant key), the reward
service and the recorder into embedded ClickHouse: one liked while open, one disliked after it ended
(re-scored), one without feedback. Then the store and the CLI report the rates.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.eventlog.recorder import Recorder
from infra.eventlog.store import ChdbStore
from reward_service.app import build
from reward_service.settings import RewardSettings
from schemas import TRANSITIONS, EpisodeScored
from tests.fakes.events import Collector
from tests.fakes.gateway_harness import GatewayHarness
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


async def _record_sessions(root: Path) -> None:
    store = ChdbStore(root / "chdb")
    store.migrate()
    try:
        async with GatewayHarness(root / "gw") as h:
            recorder = Recorder(h.bus, store, max_wait_s=0.02)
            await recorder.start()
            reward = build(RewardSettings(data_dir=root), h.bus)
            scored = await Collector().attach(h.bus, TRANSITIONS, group="stats-test")
            await reward.start()
            try:
                _, key = h.keystore.create("acme")
                auth = {"Authorization": f"Bearer {key}"}
                for session in ("liked", "disliked-late", "silent"):
                    client = openai.AsyncOpenAI(
                        base_url="http://gateway/v1",
                        api_key=key,
                        http_client=h.client,
                        default_headers={"X-Flywheel-Session": session},
                    )
                    await client.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": f"hello from {session}"}]
                    )
                fb = {"session_id": "liked", "rating": 1}
                assert (await h.client.post("/v1/feedback", json=fb, headers=auth)).status_code == 200
                for session in ("liked", "disliked-late", "silent"):
                    assert (
                        await h.client.post(f"/v1/sessions/{session}/end", headers=auth)
                    ).status_code == 200
                await scored.wait_for(lambda e: isinstance(e, EpisodeScored), within_s=30, count=3)
                fb = {"session_id": "disliked-late", "rating": -1}
                late = await h.client.post("/v1/feedback", json=fb, headers=auth)
                assert late.status_code == 200 and late.json()["rescore"] is True
                await scored.wait_for(
                    lambda e: isinstance(e, EpisodeScored) and e.score_revision == 1, within_s=30
                )

                def recorded() -> bool:
                    by_type = store.counts().by_type
                    return by_type.get("episode_scored", 0) == 4 and by_type.get("reward_reported", 0) == 2

                await wait_until(
                    recorded, within_s=30, what="the recorded events in ClickHouse", interval_s=0.05
                )
                [day] = store.stats(bucket="day")
                assert (day.episodes, day.production_sessions) == (3, 3)
                assert day.feedback_rate == pytest.approx(2 / 3)
                assert day.thumbs_up_rate == pytest.approx(1 / 2)
                assert day.mean_reward == pytest.approx(0.5)  # liked 1.0, disliked re-scored to 0.0
            finally:
                await reward.stop()
                await scored.stop()
                await recorder.stop()
    finally:
        store.close()


def test_stats_show_the_production_feedback_rate_over_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_record_sessions(tmp_path))
    for name in ("FLYWHEEL_BUS", "FLYWHEEL_ADMIN_URL", "FLYWHEEL_CLICKHOUSE_URL", "FLYWHEEL_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    cli = CliRunner()
    result = cli.invoke(app, ["stats", "--bucket", "day", "--json"])
    assert result.exit_code == 0, result.output
    [point] = json.loads(result.output)["points"]
    assert point["production_sessions"] == 3
    assert point["feedback_rate"] == pytest.approx(2 / 3) and point["thumbs_up_rate"] == pytest.approx(0.5)
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the headers in a narrow terminal
    table = cli.invoke(app, ["stats", "--bucket", "day"])
    assert table.exit_code == 0, table.output
    assert "thumbs up" in table.output and "0.67" in table.output and "0.50" in table.output
