"""Abandoned episodes are forgotten (gateway/episodes/registry.py): a gateway that admits episodes by
ticket reads no ``EpisodeFinished``, so an episode whose agent crashed would otherwise be held until the
LRU bound (20,000 episodes, each with its last prompt and turn) pushed it out."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.episodes.registry import EpisodeRegistry
from infra.tickets import EpisodeTicket
from schemas import EpisodeSource, EpisodeStarted, new_episode_id
from tests.fakes.gateway_harness import ADMIN, GatewayHarness
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
SECRET = "a-test-episode-key-0123456789"


def test_idle_episodes_and_expired_tickets_are_forgotten_as_finished() -> None:
    reg = EpisodeRegistry()
    idle, busy, prod = new_episode_id(), new_episode_id(), new_episode_id()
    reg.open(EpisodeStarted(episode_id=idle))
    reg.open(EpisodeStarted(episode_id=busy))
    reg.open(EpisodeStarted(episode_id=prod, source=EpisodeSource.production, tenant="acme", session_id="s1"))
    wall = time.time()
    ticketed = reg.admit(EpisodeTicket(new_episode_id(), None, wall + 100)).episode_id
    now = time.monotonic()
    reg.get(busy).last_active = now + 50  # type: ignore[union-attr]  # a call 50 s from now

    # 60 s later: the idle ones go; the busy one stays, and so does the ticket's until it expires
    gone = reg.expire(60.0, now=now + 60, wall=wall + 60)
    assert {s.episode_id for s in gone} == {idle, prod}
    assert reg.get(busy) is not None and reg.get(ticketed) is not None
    assert reg.get(idle) is None and reg.ended_s_ago(idle) is not None  # counts as finished
    assert reg.session("acme", "s1") is None and reg.session_episode_id("acme", "s1") == prod  # late feedback
    with pytest.raises(Exception, match="has finished"):
        reg.admit(EpisodeTicket(idle, None, wall + 100))

    assert [s.episode_id for s in reg.expire(60.0, now=now + 60, wall=wall + 101)] == [ticketed]
    assert len(reg) == 1


async def test_the_gateway_forgets_an_episode_opened_by_hand_and_counts_it(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path, episode_key=SECRET, idle_timeout_s=0.5) as h:
        opened = (await h.client.post("/admin/episodes", json={}, headers=ADMIN)).json()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app), base_url="http://gateway")
        client = openai.AsyncOpenAI(
            base_url=opened["base_url"],
            api_key="unused",
            http_client=http,
            max_retries=0,
        )
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert h.gateway.episodes.get(opened["episode_id"]) is not None
        # the gateway's own sweeper, a tenth of the timeout at a time
        await wait_until(lambda: h.gateway.episodes.get(opened["episode_id"]) is None, what="forgotten")
        metrics = h.gateway.metrics.render().decode()
        assert 'flywheel_gateway_forgotten_episodes_total{source="live"} 1.0' in metrics
        with pytest.raises(openai.NotFoundError):  # the agent came back too late
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        await client.close()
