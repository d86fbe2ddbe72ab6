"""Helpers for tests that run a gateway in-process: an event collector and a ready-made harness.

async with GatewayHarness(tmp_path) as h:          # MemoryBus + fake upstream over ASGI
    ep = await h.open_episode()
    r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={...})
    call = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.keys import KeyStore
from gateway.settings import GatewaySettings
from gateway.upstream import Upstream, make_upstream
from infra.bus.base import Bus, Message, Subscription
from infra.bus.memory import MemoryBus
from schemas import EPISODES, AnyEvent, EpisodeStarted, LogprobsMode, UpstreamKind, new_episode_id
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

ADMIN = {"Authorization": "Bearer test-admin"}


class Collector:
    """Subscribes to topics (its own consumer group) and lets a test await the events it expects."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self._changed = asyncio.Condition()
        self._subs: list[Subscription] = []

    async def attach(self, bus: Bus, *topics: str, group: str = "test-collector") -> Collector:
        for topic in topics:
            self._subs.append(await bus.subscribe(topic, f"{group}.{topic}", self._on, from_beginning=True))
        return self

    async def _on(self, msg: Message) -> None:
        async with self._changed:
            self.events.append(msg.event)
            self._changed.notify_all()

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(
        self, pred: Callable[[AnyEvent], bool], within_s: float = 5.0, count: int = 1
    ) -> list[Any]:
        async def _wait() -> list[Any]:
            async with self._changed:
                while True:
                    got = [e for e in self.events if pred(e)]
                    if len(got) >= count:
                        return got
                    await self._changed.wait()

        return await asyncio.wait_for(_wait(), within_s)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.stop()


class GatewayHarness:
    def __init__(
        self,
        data_dir: Path,
        *,
        config: FakeUpstreamConfig | None = None,
        kind: UpstreamKind = UpstreamKind.vllm,
        bus: Bus | None = None,
        replicas: int = 1,
        **settings: Any,
    ) -> None:
        self.config = config or FakeUpstreamConfig()
        self.fake = create_fake_upstream(self.config)
        self.bus: Bus = bus or MemoryBus()
        self._own_bus = bus is None
        defaults: dict[str, Any] = {
            "data_dir": data_dir,
            "admin_token": "test-admin",
            "gateway_id": "gw-test",
            "episode_wait_s": 0.3,
            "upstream_backoff_s": 0.01,
            "upstream_timeout_s": 5.0,
        }
        self.settings = GatewaySettings(**{**defaults, **settings})
        self.keystore = KeyStore(data_dir / "gateway" / "keys.json")
        self.upstreams: list[Upstream] = [
            make_upstream(
                f"http://fake{i}/v1",
                kind=kind,
                logprobs_mode=LogprobsMode.processed,
                timeout_s=self.settings.upstream_timeout_s,
                transport=httpx.ASGITransport(app=self.fake),
            )
            for i in range(replicas)
        ]
        self.app = create_app(self.settings, self.bus, self.upstreams, keystore=self.keystore, lifespan=False)
        self.gateway = self.app.state.gateway
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app, raise_app_exceptions=False),
            base_url="http://gateway",
            timeout=30,
        )
        self.events = Collector()

    async def __aenter__(self) -> GatewayHarness:
        if self._own_bus:
            await self.bus.start()
        await self.bus.ensure_topics(["flywheel.episodes", "flywheel.control", "flywheel.deadletter"])
        await self.events.attach(self.bus, EPISODES, "flywheel.control")
        await self.gateway.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.gateway.stop()
        await self.events.stop()
        if self._own_bus:
            await self.bus.stop()

    async def open_episode(self, **fields: Any) -> str:
        """Open a training episode the way a worker does: ``EpisodeStarted`` on the bus."""
        episode_id = new_episode_id()
        await self.bus.publish(EPISODES, EpisodeStarted(episode_id=episode_id, **fields))
        await self.wait_open(episode_id)
        return episode_id

    async def wait_open(self, episode_id: str) -> None:
        """Returns once the gateway has seen the episode open (its registry waits on the event)."""
        await self.gateway.episodes.training(episode_id)
