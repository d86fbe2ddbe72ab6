"""Issue 21, finding 2, and the fault suite's gateway run: ``kill -9`` the gateway mid-episode, restart.

A real ``flywheel gateway`` on Kafka, four agents calling through the ``openai`` SDK on their own
training episodes. The gateway is killed with SIGKILL mid-load and restarted on the same data
directory; the agents keep calling in the same episodes. Every call answered 200 must be on the
topic (nothing lost), and each episode's ``call_seq`` must be unique and follow the calls' order.
Before the fix the restarted gateway numbered every open episode from 0 again (484 pairs reused).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import openai
import pytest

import schemas as s
from infra.bus.base import Message
from infra.bus.kafka import KafkaBus
from tests.fakes.upstream import create_fake_upstream
from tests.fakes.waiting import wait_until
from tests.faults.procs import TOKEN, Figures, GatewayProcess, ThreadServer, clean_env

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(150)]
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
AGENTS = 4
CALLS_BEFORE, CALLS_AFTER = 40, 40


class Agent(threading.Thread):
    """One episode, calls one after another; a failed call (gateway down) is tried again."""

    def __init__(self, base_url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=10, max_retries=0)
        self.stop_event = stop
        self.answered: list[str] = []  # call ids of 200 answers
        self.failed = 0
        self.server_errors = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                self.answered.append(raw.headers["x-flywheel-call"])
            except openai.APIStatusError as exc:
                self.failed += 1
                self.server_errors += exc.status_code >= 500
                self.stop_event.wait(0.05)
            except openai.APIConnectionError:
                self.failed += 1
                self.stop_event.wait(0.05)  # the gateway is down: try again shortly
        self.client.close()


async def _recorded(bootstrap: str, prefix: str, want: set[str]) -> list[s.LLMCallRecorded]:
    bus = KafkaBus(bootstrap, prefix=prefix)
    await bus.start()
    calls: list[s.LLMCallRecorded] = []
    seen: asyncio.Event = asyncio.Event()

    async def on(message: Message) -> None:
        if isinstance(message.event, s.LLMCallRecorded):
            calls.append(message.event)
            if want <= {c.call_id for c in calls}:
                seen.set()

    try:
        await bus.subscribe(s.EPISODES, "restart-check", on, from_beginning=True)
        async with asyncio.timeout(30):
            await seen.wait()
    except TimeoutError:
        pass
    finally:
        await bus.stop()
    return calls


@pytest.mark.parametrize("admission", ["topic", "ticket"])
def test_call_seq_survives_a_gateway_kill9(
    admission: str, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """``topic``: the gateway learns episodes and calls from flywheel.episodes; ``ticket``: it reads
    nothing of the topic (signed episode URLs) and keeps its numbering in gateway/episodes/seqs.py's journal."""
    key = {"FLYWHEEL_EPISODE_KEY": "restart-test-episode-key-0123"} if admission == "ticket" else {}
    env = clean_env(
        FLYWHEEL_BUS="kafka",
        FLYWHEEL_KAFKA_BOOTSTRAP=kafka_bootstrap,
        FLYWHEEL_TOPIC_PREFIX=topic_prefix,
        **key,
    )
    with ThreadServer(create_fake_upstream()) as upstream:
        gw = GatewayProcess(upstream.url, tmp_path / "gw", env, tmp_path / "gateway.log")
        gw.start()
        gw.wait_ready()
        stop = threading.Event()
        try:
            with httpx.Client(timeout=10, headers=ADMIN) as admin:
                urls = [
                    admin.post(f"{gw.url}/admin/episodes", json={}).json()["base_url"] for _ in range(AGENTS)
                ]
            agents = [Agent(url, stop) for url in urls]
            for agent in agents:
                agent.start()
            total = lambda: sum(len(a.answered) for a in agents)  # noqa: E731
            # the agents are threads: no event to await across them, so a short event loop polls
            asyncio.run(
                wait_until(lambda: total() >= CALLS_BEFORE, 60, "calls before the kill", interval_s=0.02)
            )
            gw.kill9()  # mid-episode, calls in flight
            killed = time.monotonic()
            at_kill = total()
            gw.start()  # same port, same data directory, a new process
            gw.wait_ready()
            asyncio.run(
                wait_until(lambda: total() > at_kill, 60, "the first call after the restart", interval_s=0.02)
            )
            recover_s = time.monotonic() - killed
            asyncio.run(
                wait_until(
                    lambda: total() >= at_kill + CALLS_AFTER, 60, "calls after the restart", interval_s=0.02
                )
            )
        finally:
            stop.set()
            for agent in agents:
                agent.join(15)
            gw.stop()
    answered = {cid for a in agents for cid in a.answered}
    calls = asyncio.run(_recorded(kafka_bootstrap, topic_prefix, answered))
    unique = {c.event_id: c for c in calls}.values()  # dedup by event_id, as every consumer does
    lost = answered - {c.call_id for c in unique}
    by_pair: dict[tuple[str, int], set[str]] = defaultdict(set)
    for c in unique:
        by_pair[(c.episode_id, c.call_seq)].add(c.call_id)
    reused = {pair: ids for pair, ids in by_pair.items() if len(ids) > 1}
    out_of_order = 0
    for episode in {c.episode_id for c in unique}:
        mine = sorted((c for c in unique if c.episode_id == episode), key=lambda c: c.emitted_at)
        seqs = [c.call_seq for c in mine]
        out_of_order += seqs != sorted(seqs)
    Figures(
        f"gateway_kill9_{admission}",
        calls=len(answered),
        ok=len(answered),
        lost=len(lost),
        duplicates=len(reused),
        server_errors=sum(a.server_errors for a in agents),
        recover_s=round(recover_s, 2),
        extra={"failed_while_down": sum(a.failed for a in agents), "out_of_order_episodes": out_of_order},
    ).report()
    assert not lost, f"{len(lost)} answered calls are not on the topic"
    assert not reused, f"{len(reused)} (episode, call_seq) pairs used twice, e.g. {list(reused.items())[:3]}"
    assert out_of_order == 0
    assert all(len(a.answered) > 0 for a in agents)
