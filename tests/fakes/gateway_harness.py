"""Helpers for tests that run a gateway in-process: a ready-made harness (``h.events`` is a ``Collector``).

async with GatewayHarness(tmp_path) as h:          # MemoryBus + fake upstream over ASGI
    ep = await h.open_episode()
    r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={...})
    call = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.keys import KeyStore
from gateway.settings import GatewaySettings
from gateway.upstream.client import Upstream, make_upstream
from infra.bus.base import Bus
from infra.bus.memory import MemoryBus
from schemas import EPISODES, EpisodeStarted, LogprobsMode, UpstreamKind, new_episode_id
from tests.fakes.events import Collector
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

ADMIN = {"Authorization": "Bearer test-admin"}


class GatewayHarness:
    def __init__(
        self,
        data_dir: Path,
        *,
        config: FakeUpstreamConfig | None = None,
        kind: UpstreamKind = UpstreamKind.vllm,
        bus: Bus | None = None,
        replicas: int = 1,
        upstream_app: Any = None,
        upstream_url: str | None = None,
        **settings: Any,
    ) -> None:
        """``upstream_url``: a live engine (vLLM) instead of the fake, reached over real HTTP."""
        self.config = config or FakeUpstreamConfig()
        self.fake = upstream_app if upstream_app is not None else create_fake_upstream(self.config)
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
        self.upstreams: list[Upstream] = (
            [
                make_upstream(
                    upstream_url,
                    kind=kind,
                    logprobs_mode=LogprobsMode.processed,
                    timeout_s=self.settings.upstream_timeout_s,
                )
            ]
            if upstream_url is not None
            else [
                make_upstream(
                    f"http://fake{i}/v1",
                    kind=kind,
                    logprobs_mode=LogprobsMode.processed,
                    timeout_s=self.settings.upstream_timeout_s,
                    transport=httpx.ASGITransport(app=self.fake, raise_app_exceptions=False),
                )
                for i in range(replicas)
            ]
        )
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


class BackgroundGateway:
    """A harness served by uvicorn on a loopback port from its own thread and event loop.

    For clients that block (the sync ``openai`` SDK, ``requests``-based schemathesis). The gateway, the
    bus and the fake upstream all live in the background loop; ``run(coro)`` executes there.

        with BackgroundGateway(tmp_path) as g:
            base = g.episode_url(g.open_episode())
    """

    def __init__(self, data_dir: Path, **harness: Any) -> None:
        import threading

        self._harness_kwargs = harness
        self._data_dir = data_dir
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-loop", daemon=True)
        self.url = ""
        self.harness: GatewayHarness | None = None
        self._server: Any = None

    def run(self, coro: Any, within_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(within_s)

    def __enter__(self) -> BackgroundGateway:
        from gateway.server import GatewayServer

        self._thread.start()

        async def _up() -> str:
            self.harness = GatewayHarness(self._data_dir, **self._harness_kwargs)
            await self.harness.__aenter__()
            self._server = GatewayServer(self.harness.app, port=0)
            return await self._server.start()

        self.url = self.run(_up())
        return self

    def __exit__(self, *exc: object) -> None:
        async def _down() -> None:
            await self._server.stop()
            assert self.harness is not None
            await self.harness.__aexit__()

        try:
            self.run(_down())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    @property
    def h(self) -> GatewayHarness:
        assert self.harness is not None
        return self.harness

    def open_episode(self) -> str:
        return str(self.run(self.h.open_episode()))

    def episode_url(self, episode_id: str) -> str:
        return f"{self.url}/episodes/{episode_id}/v1"

    def calls(self, episode_id: str, count: int, within_s: float = 10.0) -> list[Any]:
        """The episode's recorded calls (waits until ``count`` arrived), in call order."""
        from schemas import LLMCallRecorded

        got = self.run(
            self.h.events.wait_for(
                lambda e: isinstance(e, LLMCallRecorded) and e.episode_id == episode_id, within_s, count
            ),
            within_s + 5,
        )
        return sorted(got, key=lambda c: c.call_seq)
