"""A rollout stack for end-to-end tests and the rollouts benchmark: the real gateway served over HTTP on
a loopback port (in front of the fake vLLM-compatible upstream, or any ASGI upstream such as the
embedded engine's app), rollout workers and the reward service, each on its own bus connection (Kafka
or one shared in-process bus)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gateway.app import create_app
from gateway.keys import KeyStore
from gateway.settings import GatewaySettings
from gateway.upstream import make_upstream
from infra.bus.base import Bus
from reward_service.app import build
from reward_service.service import RewardService
from reward_service.settings import RewardSettings
from rollout_worker.service import RolloutWorker
from rollout_worker.settings import WorkerSettings
from schemas import CONTROL, DEADLETTER, EPISODES, TASKS, TRANSITIONS, LogprobsMode, UpstreamKind
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

ALL_TOPICS = [TASKS, EPISODES, TRANSITIONS, CONTROL, DEADLETTER]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RolloutStack:
    def __init__(
        self,
        tmp: Path,
        *,
        kafka: str | None = None,
        prefix: str = "",
        fake: FakeUpstreamConfig | None = None,
        worker_settings: dict[str, Any] | None = None,
        reward_settings: dict[str, Any] | None = None,
        upstream_app: Any | None = None,
        upstream_kind: UpstreamKind = UpstreamKind.vllm,
        upstream_timeout_s: float = 10.0,
        gateway_settings: dict[str, Any] | None = None,
    ) -> None:
        self.tmp = tmp
        self.kafka = kafka
        self.prefix = prefix
        self.fake = fake or FakeUpstreamConfig(use_tools=False, keep_requests=False)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker_settings = worker_settings or {}
        self.reward_settings = reward_settings or {}
        self.upstream_app = upstream_app
        self.upstream_kind = upstream_kind
        self.upstream_timeout_s = upstream_timeout_s
        self.gateway_settings = gateway_settings or {}
        self.buses: list[Bus] = []
        self.workers: list[RolloutWorker] = []
        self.reward: RewardService | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._shared: Bus | None = None

    def env(self) -> dict[str, str]:
        """Environment for a ``flywheel`` subprocess on the same bus."""
        out = {"FLYWHEEL_TOPIC_PREFIX": self.prefix, "FLYWHEEL_GATEWAY_URL": self.url}
        if self.kafka:
            out |= {"FLYWHEEL_BUS": "kafka", "FLYWHEEL_KAFKA_BOOTSTRAP": self.kafka}
        return out

    async def bus(self) -> Bus:
        if self.kafka is None:
            if self._shared is None:
                from infra.bus.memory import MemoryBus

                self._shared = MemoryBus(max_backlog=100_000)
                await self._shared.start()
                self.buses.append(self._shared)
            return self._shared
        from infra.bus.kafka import KafkaBus

        bus = KafkaBus(self.kafka, prefix=self.prefix, session_timeout_ms=6000)
        await bus.start()
        self.buses.append(bus)
        return bus

    async def start(self, *, workers: int = 1, reward: bool = True) -> RolloutStack:
        first = await self.bus()
        await first.ensure_topics(ALL_TOPICS)
        settings = GatewaySettings(
            data_dir=self.tmp,
            admin_token="test-admin",
            gateway_id="gw-rollouts",
            episode_wait_s=5.0,
            upstream_timeout_s=self.upstream_timeout_s,
            **self.gateway_settings,
        )
        upstream = make_upstream(
            "http://fake/v1",
            kind=self.upstream_kind,
            logprobs_mode=LogprobsMode.processed,
            timeout_s=self.upstream_timeout_s,
            transport=httpx.ASGITransport(app=self.upstream_app or create_fake_upstream(self.fake)),
        )
        app = create_app(settings, first, [upstream], keystore=KeyStore(self.tmp / "keys.json"))
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._serving = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._serving.done():
                await self._serving
            await asyncio.sleep(0.02)
        for i in range(workers):
            await self.add_worker(f"w{i}")
        if reward:
            rs = RewardSettings(
                reward_group="reward-service",
                journal=self.tmp / f"reward-{self.prefix}.sqlite" if self.kafka else None,
                gateway_url=self.url,
                **self.reward_settings,
            )
            self.reward = build(rs, await self.bus())
            await self.reward.start()
        return self

    async def add_worker(self, worker_id: str) -> RolloutWorker:
        ws = WorkerSettings(gateway_url=self.url, worker_id=worker_id, **self.worker_settings)
        worker = RolloutWorker(await self.bus(), ws)
        await worker.start()
        self.workers.append(worker)
        return worker

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop(drain_timeout_s=1.0) for w in self.workers))
        if self.reward is not None:
            await self.reward.stop()
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
        for bus in reversed(self.buses):
            await bus.stop()
