"""Self-certifying episode URLs (infra/tickets.py): a gateway with ``FLYWHEEL_EPISODE_KEY`` admits a
signed episode's calls without reading ``flywheel.episodes``, refuses forged or expired tickets with an
OpenAI-format 404, and keeps ``call_seq`` unique and ordered across a restart (gateway/episodes/seqs.py)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from infra.tickets import EpisodeTicket, TicketError, TicketKey
from schemas import EPISODES, LLMCallRecorded, new_episode_id
from tests.fakes.gateway_harness import ADMIN, GatewayHarness

pytestmark = pytest.mark.timeout(60)
SECRET = "a-test-episode-key-0123456789"


def test_a_ticket_round_trips_and_anything_else_is_refused() -> None:
    key = TicketKey(SECRET)
    episode = new_episode_id()
    segment = key.sign(EpisodeTicket(episode, "group-1", time.time() + 60))
    ticket = key.read(segment)
    assert ticket is not None and (ticket.episode_id, ticket.group_id) == (episode, "group-1")
    assert key.read(episode) is None  # a plain id is not a ticket
    assert ticket.model is None  # no model claim: the gateway's default
    versioned = key.read(key.sign(EpisodeTicket(episode, "group-1", time.time() + 60, "policy@v12")))
    assert versioned is not None and versioned.model == "policy@v12"  # the version that routes it
    head, claims, signature = segment.rsplit(".", 2)
    forged = [
        f"{new_episode_id()}.{claims}.{signature}",  # another episode under this signature
        f"{head}.{claims[:-2]}AA.{signature}",  # changed claims
        f"{head}.{claims}.{signature[:-2]}AA",  # changed signature
        f"{head}.{claims}.!!",  # not base64
        TicketKey("another-key-0123456789").sign(EpisodeTicket(episode, None, time.time() + 60)),
        key.sign(EpisodeTicket(episode, None, time.time() - 1)),  # expired
    ]
    for bad in forged:
        with pytest.raises(TicketError):
            key.read(bad)
    with pytest.raises(ValueError, match="at least 16"):
        TicketKey("short")
    with pytest.raises(ValidationError, match="FLYWHEEL_EPISODE_KEY"):
        GatewaySettings(episode_key="short")


def _client(h: GatewayHarness, segment: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app), base_url="http://gateway")
    return openai.AsyncOpenAI(
        base_url=f"http://gateway/episodes/{segment}/v1", api_key="unused", http_client=http, max_retries=0
    )


async def _call(client: openai.AsyncOpenAI) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return raw.headers["x-flywheel-call"]


async def test_a_signed_episode_is_served_without_reading_the_episodes_topic(tmp_path: Path) -> None:
    key = TicketKey(SECRET)
    async with GatewayHarness(tmp_path, episode_key=SECRET, episode_wait_s=5.0) as h:
        groups = h.bus._topics[EPISODES].groups  # type: ignore[attr-defined]
        assert not [g for g in groups if g.startswith("gateway.")], "a ticket gateway must not read the topic"
        episode = new_episode_id()
        client = _client(h, key.sign(EpisodeTicket(episode, "g-7", time.time() + 60)))
        ids = [await _call(client) for _ in range(3)]
        calls = await h.events.wait_for(
            lambda e: isinstance(e, LLMCallRecorded) and e.call_id in ids, count=3
        )
        assert sorted(c.call_seq for c in calls) == [0, 1, 2]
        assert {c.episode_id for c in calls} == {episode}
        assert h.gateway.episodes.get(episode).group_id == "g-7"

        forged = key.sign(EpisodeTicket(new_episode_id(), None, time.time() + 60)).rsplit(".", 1)[0] + ".AAAA"
        expired = key.sign(EpisodeTicket(new_episode_id(), None, time.time() - 1))
        for segment, words in ((forged, "not valid"), (expired, "expired")):
            with pytest.raises(openai.NotFoundError) as err:
                await _call(_client(h, segment))
            assert err.value.code == "episode_not_found" and words in err.value.message
        # an unsigned id is not waited for (nothing would announce it): 404 at once, saying why
        started = time.monotonic()
        with pytest.raises(openai.NotFoundError) as err:
            await _call(_client(h, new_episode_id()))
        assert time.monotonic() - started < 2.0
        assert "FLYWHEEL_EPISODE_KEY" in err.value.message
        # an episode opened by hand on this gateway gets a signed URL too
        opened = (await h.client.post("/admin/episodes", json={}, headers=ADMIN)).json()
        assert opened["base_url"].count(".") >= 2
        segment = opened["base_url"].rsplit("/episodes/", 1)[1].removesuffix("/v1")
        await _call(_client(h, segment))
        await client.close()


async def test_call_seq_continues_after_a_restart_without_the_topic(tmp_path: Path) -> None:
    key = TicketKey(SECRET)
    segment = key.sign(EpisodeTicket(new_episode_id(), None, time.time() + 60))
    seqs: list[int] = []
    for _ in range(2):  # the same data directory, a new gateway: a restart
        async with GatewayHarness(tmp_path, episode_key=SECRET) as h:
            client = _client(h, segment)
            ids = {await _call(client) for _ in range(3)}
            calls = await h.events.wait_for(
                lambda e, ids=ids: isinstance(e, LLMCallRecorded) and e.call_id in ids, count=3
            )
            seqs += sorted(c.call_seq for c in calls)
            await client.close()
    assert seqs[:3] == [0, 1, 2]
    assert seqs[3:] == [64, 65, 66]  # after the block the first gateway reserved: unique and in order
