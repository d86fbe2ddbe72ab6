"""Gateways as replicas: an episode's calls may reach any gateway (docs/operating.md, "Gateway replicas").

Two gateways admit episodes by signed ticket (the same ``FLYWHEEL_EPISODE_KEY``) on one in-process bus,
with the real reward service on it. A gateway numbers an episode's calls (``call_seq``) from what it
has served itself (by ticket it reads nothing of ``flywheel.episodes``), so two gateways serving one
episode number it independently. The reward service keeps every recorded call (by ``call_id``) and, where
numbers repeat, orders the episode by the conversation (each call's prompt extends the previous call's
prompt and answer) and numbers it 0..n-1 in that order (reward_service/ordering.py). So:

- every call on one gateway: numbers 0..3 in the calls' order, kept as recorded, and the four calls
  become one transition whose generated tokens are all trained on;
- calls alternating between the two gateways back to back (no affinity): each gateway numbers its own
  calls 0, 1, so the episode holds two calls numbered 0 and two numbered 1; the reward service scores all
  four, in the order they were made (numbered 0..3), as one transition whose generated tokens are all
  trained on (mask 1), none taken for observation;
- calls moving to the other gateway halfway (a replica lost, affinity broken): numbered 0, 1, 0, 1, and
  the same: four calls, one transition, every generated token trained on.

Learning episodes from the topic instead, the gateways number right once each has read the call before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.upstream.client import make_upstream
from infra.bus.base import Message
from infra.bus.memory import MemoryBus
from infra.tickets import EpisodeTicket, TicketKey
from reward_service.app import build
from reward_service.service import RewardService
from reward_service.settings import RewardSettings
from schemas import (
    EPISODES,
    TOPICS,
    TRANSITIONS,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    LogprobsMode,
    Transition,
    UpstreamKind,
    new_episode_id,
)
from tests.fakes.events import Collector
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

pytestmark = pytest.mark.timeout(60)
SECRET = "a-test-episode-key-0123456789"
CALLS = 4


@dataclass
class Replicas:
    bus: MemoryBus
    gateways: list[Gateway]
    clients: list[httpx.AsyncClient]
    events: Collector
    scored: list[EpisodeScored]
    tickets: bool
    reward: RewardService


@asynccontextmanager
async def _replicas(tmp_path: Path, *, tickets: bool = True) -> AsyncIterator[Replicas]:
    """Two gateways (own data dirs, ids and fake engines) and the reward service, on one bus; by ticket,
    else learning episodes from the topic."""
    bus = MemoryBus()
    await bus.start()
    await bus.ensure_topics(list(TOPICS))
    events = await Collector().attach(bus, EPISODES, group="replicas-test")
    reward = build(RewardSettings(data_dir=tmp_path / "reward", reward_group="reward-test"), bus)
    await reward.start()
    scored: list[EpisodeScored] = []

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)

    sub = await bus.subscribe(TRANSITIONS, "replicas-test.scored", on_scored, from_beginning=True)
    gateways: list[Gateway] = []
    clients: list[httpx.AsyncClient] = []
    for name in ("a", "b"):
        settings = GatewaySettings(
            data_dir=tmp_path / name,
            gateway_id=f"gw-{name}",
            episode_key=SECRET if tickets else "",
            admin_token="test-admin",
        )
        upstream = make_upstream(
            "http://fake/v1",
            kind=UpstreamKind.vllm,
            logprobs_mode=LogprobsMode.processed,
            transport=httpx.ASGITransport(app=create_fake_upstream(FakeUpstreamConfig(use_tools=False))),
        )
        app = create_app(settings, bus, [upstream], lifespan=False)
        await app.state.gateway.start()
        gateways.append(app.state.gateway)
        clients.append(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://gateway-{name}")
        )
    try:
        yield Replicas(bus, gateways, clients, events, scored, tickets, reward)
    finally:
        for client in clients:
            await client.aclose()
        for gateway in gateways:
            await gateway.stop()
        await sub.stop()
        await reward.stop()
        await events.stop()
        await bus.stop()


async def _episode(
    r: Replicas, gateway_of_call: list[int], *, settle: bool = False
) -> tuple[list[LLMCallRecorded], EpisodeScored]:
    """One episode of ``CALLS`` chat calls, call ``k`` sent to gateway ``gateway_of_call[k]`` as soon as
    call ``k - 1`` answered (``settle``: and that gateway has read calls ``0..k-1`` from the topic); each
    call's messages extend the previous call's with its answer. Returns the recorded calls in the order
    they were made and the reward service's ``EpisodeScored``."""
    episode = new_episode_id()
    segment = (
        TicketKey(SECRET).sign(EpisodeTicket(episode, "group-1", time.time() + 60)) if r.tickets else episode
    )
    await r.bus.publish(EPISODES, EpisodeStarted(episode_id=episode, group_id="group-1"))  # as a worker does
    agents = [
        openai.AsyncOpenAI(
            base_url=f"{str(client.base_url).rstrip('/')}/episodes/{segment}/v1",
            api_key="unused",
            http_client=client,
            max_retries=0,
        )
        for client in r.clients
    ]
    messages: list[dict[str, str]] = [{"role": "user", "content": "What is 6 times 7?"}]
    call_ids: list[str] = []
    for n, k in enumerate(gateway_of_call):
        if settle and n:
            await _has_read(r.gateways[k], episode, n)
        raw = await agents[k].chat.completions.with_raw_response.create(
            model="policy",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=32,
        )
        call_ids.append(raw.headers["x-flywheel-call"])
        answer = raw.parse().choices[0].message.content or ""
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Sure?"}]
    recorded = await r.events.wait_for(
        lambda e: isinstance(e, LLMCallRecorded) and e.call_id in call_ids, count=len(call_ids)
    )
    by_id = {c.call_id: c for c in recorded}
    await r.bus.publish(
        EPISODES,
        EpisodeFinished(episode_id=episode, status=EpisodeStatus.ok, reported_reward=1.0, group_id="group-1"),
    )
    deadline = asyncio.get_running_loop().time() + 20
    while not [s for s in r.scored if s.episode_id == episode]:
        assert asyncio.get_running_loop().time() < deadline, "the episode was not scored"
        await asyncio.sleep(0.02)
    [scored] = [s for s in r.scored if s.episode_id == episode]
    return [by_id[i] for i in call_ids], scored


async def _has_read(gateway: Gateway, episode: str, calls: int) -> None:
    """Until ``gateway`` numbers the episode's next call after its first ``calls`` (its consumer lag)."""
    async with asyncio.timeout(10):
        # the registry offers no event to wait on: poll its numbering
        while (state := gateway.episodes.get(episode)) is None or state.next_seq < calls:  # noqa: ASYNC110
            await asyncio.sleep(0.005)


def _generated(call: LLMCallRecorded) -> int:
    return sum(len(choice.token_ids or []) for choice in call.choices)


def _trained_in_order(t: Transition, calls: list[LLMCallRecorded]) -> None:
    """``t`` holds ``calls`` in this order, each one's generated tokens where its segment starts, trained on
    (mask 1), and no other token trained on."""
    assert t.call_seqs == list(range(len(calls)))
    starts = t.segment_starts
    assert starts is not None and len(starts) == len(calls)
    for start, call in zip(starts, calls, strict=True):
        ids = call.choices[0].token_ids or []
        assert ids and t.response_ids[start : start + len(ids)] == ids
        assert set(t.response_mask[start : start + len(ids)]) == {1}
    assert sum(t.response_mask) == sum(_generated(c) for c in calls)


async def test_an_episode_on_one_gateway_is_numbered_in_order_and_trained_whole(tmp_path: Path) -> None:
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [0] * CALLS)
        renumbered = r.reward.stats.renumbered
    assert [c.call_seq for c in calls] == list(range(CALLS))
    assert {c.producer for c in calls} == {calls[0].producer}
    assert (scored.num_calls, scored.prefix_mismatches, renumbered) == (CALLS, 0, 0)
    [t] = scored.transitions  # every call extends the previous one: one trajectory
    _trained_in_order(t, calls)


async def test_alternating_gateways_reuse_numbers_and_the_reward_service_orders_the_calls(
    tmp_path: Path,
) -> None:
    """Without affinity: the module docstring."""
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [k % 2 for k in range(CALLS)])
        renumbered = r.reward.stats.renumbered
    assert len({c.producer for c in calls}) == 2  # both gateways served the episode
    assert [c.call_seq for c in calls] == [0, 0, 1, 1]  # each numbered its own calls: duplicates
    assert (scored.num_calls, scored.prefix_mismatches, renumbered) == (CALLS, 0, 1)  # none dropped
    [t] = scored.transitions  # one trajectory, in the order the calls were made (numbered 0..3)
    _trained_in_order(t, calls)


async def test_an_episode_moved_to_another_gateway_midway_keeps_its_later_calls(tmp_path: Path) -> None:
    """Affinity lost mid-episode (the replica died, or the load balancer moved the client): the other
    gateway numbers the episode's later calls from 0 again; the reward service still orders them last."""
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [0, 0, 1, 1])
    assert [c.call_seq for c in calls] == [0, 1, 0, 1]
    assert (scored.num_calls, scored.prefix_mismatches) == (CALLS, 0)
    [t] = scored.transitions
    _trained_in_order(t, calls)


async def test_learning_from_the_topic_replicas_number_right_once_each_has_read_the_last_call(
    tmp_path: Path,
) -> None:
    """Without tickets a gateway numbers after every call it has read from ``flywheel.episodes``: calls
    alternating between two gateways are numbered right when each call comes after its gateway has read
    the one before (further apart than the consumer lag, ~20 ms on Kafka)."""
    async with _replicas(tmp_path, tickets=False) as r:
        calls, scored = await _episode(r, [k % 2 for k in range(CALLS)], settle=True)
    assert len({c.producer for c in calls}) == 2
    assert [c.call_seq for c in calls] == list(range(CALLS))
    assert (scored.num_calls, scored.prefix_mismatches) == (CALLS, 0)
    [t] = scored.transitions
    _trained_in_order(t, calls)
