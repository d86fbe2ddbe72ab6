"""Gateways as replicas: an episode's calls must reach one gateway (docs/operating.md, "Scaling").

Two gateways admit episodes by signed ticket (the same ``FLYWHEEL_EPISODE_KEY``) on one in-process bus,
with the real reward service on it. A gateway numbers an episode's calls (``call_seq``) from what it
has served itself (by ticket it reads nothing of ``flywheel.episodes``), and the reward service keeps
one call per ``call_seq`` (the first it receives) and orders them by it (reward_service/state.py,
reward_service/transitions.py). So:

- every call on one gateway (the rule: session affinity, or a load balancer sticky on the episode's
  path): numbers 0..3 in the calls' order, and the four calls become one transition whose generated
  tokens are all trained on;
- calls alternating between the two gateways back to back (no affinity): each gateway numbers its own
  calls 0, 1, so the episode holds two calls numbered 0 and two numbered 1; the reward service drops the
  second of each (two of four calls lost) and merges the rest into one transition in which the lost
  call's generated tokens (the policy's own) sit among the observation tokens (mask 0), untrained;
- calls moving to the other gateway halfway (a replica lost, affinity broken): numbered 0, 1, 0, 1, and
  the last two calls are dropped.

The last two tests pin this breakage down: if numbering ever becomes correct across replicas, they
fail, and docs/operating.md and docs/limits.md should say so.
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
        yield Replicas(bus, gateways, clients, events, scored, tickets)
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


async def test_an_episode_on_one_gateway_is_numbered_in_order_and_trained_whole(tmp_path: Path) -> None:
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [0] * CALLS)
    assert [c.call_seq for c in calls] == list(range(CALLS))
    assert {c.producer for c in calls} == {calls[0].producer}
    assert (scored.num_calls, scored.prefix_mismatches) == (CALLS, 0)
    [t] = scored.transitions  # every call extends the previous one: one trajectory
    assert t.call_seqs == list(range(CALLS))
    assert sum(t.response_mask) == sum(_generated(c) for c in calls)  # every generated token is trained on


async def test_alternating_gateways_reuse_numbers_and_the_reward_service_loses_calls(tmp_path: Path) -> None:
    """Without affinity (what breaks): the module docstring."""
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [k % 2 for k in range(CALLS)])
    assert len({c.producer for c in calls}) == 2  # both gateways served the episode
    assert [c.call_seq for c in calls] == [0, 0, 1, 1]  # each numbered its own calls: duplicates
    assert scored.num_calls == 2  # the second call of each number was dropped
    [t] = scored.transitions
    assert t.call_seqs == [0, 1]  # calls 0 and 2 of the four
    starts = t.segment_starts
    assert starts is not None and t.response_ids[starts[1] :] == calls[2].choices[0].token_ids
    kept = _generated(calls[0]) + _generated(calls[2])
    assert sum(t.response_mask) == kept < sum(_generated(c) for c in calls)
    # call 1's generated tokens are in the transition, as observation (mask 0): the policy's own tokens
    lost = calls[1].choices[0].token_ids or []
    first = len(calls[0].choices[0].token_ids or [])
    between = t.response_ids[first : starts[1]]
    assert lost
    at = next(i for i in range(len(between)) if between[i : i + len(lost)] == lost)
    assert set(t.response_mask[first + at : first + at + len(lost)]) == {0}


async def test_an_episode_moved_to_another_gateway_midway_loses_its_later_calls(tmp_path: Path) -> None:
    """Affinity lost mid-episode (the replica died, or the load balancer moved the client): the other
    gateway numbers the episode's later calls from 0 again and the reward service drops them."""
    async with _replicas(tmp_path) as r:
        calls, scored = await _episode(r, [0, 0, 1, 1])
    assert [c.call_seq for c in calls] == [0, 1, 0, 1]
    assert scored.num_calls == 2
    [t] = scored.transitions
    assert t.call_seqs == [0, 1]
    assert sum(t.response_mask) == _generated(calls[0]) + _generated(calls[1])  # calls 2 and 3: gone


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
    assert t.call_seqs == list(range(CALLS))
    assert sum(t.response_mask) == sum(_generated(c) for c in calls)
