"""``infra.service.serve``: the one way a service runs alone (order of start and stop, HTTP, signals)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gateway.server import GatewayServer
from infra import service
from infra.bus.base import Bus
from infra.settings import FlywheelSettings

pytestmark = pytest.mark.timeout(30)


class Recording:
    def __init__(self, log: list[str], bus: Bus) -> None:
        self.log = log
        self.bus = bus
        self.stop_requested = asyncio.Event()
        self.started = asyncio.Event()

    async def start(self) -> None:
        self.log.append("start")
        self.started.set()

    async def stop(self) -> None:
        self.log.append("stop")

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/ping")
        async def ping() -> dict[str, bool]:
            return {"started": "start" in self.log}

        return app

    async def run(self) -> None:
        await self.stop_requested.wait()
        self.log.append("finished the step in progress")


def _settings(tmp_path: Path, **update: object) -> FlywheelSettings:
    return FlywheelSettings(data_dir=tmp_path).model_copy(update=update)


async def test_a_service_serves_http_until_a_signal_and_stops_in_reverse_order(tmp_path: Path) -> None:
    log: list[str] = []
    urls: asyncio.Queue[str] = asyncio.Queue()
    answers: list[dict[str, bool]] = []

    def started(svc: Recording, url: str) -> None:
        urls.put_nowait(url)

    async def ask_then_signal() -> None:
        url = await urls.get()
        async with httpx.AsyncClient() as client:
            answers.append((await client.get(f"{url}/ping")).json())
        os.kill(os.getpid(), signal.SIGTERM)  # the runner owns SIGTERM: it stops, the test goes on

    asker = asyncio.create_task(ask_then_signal())
    await service.serve(
        _settings(tmp_path),
        lambda bus: Recording(log, bus),
        name="test",
        topics=["flywheel.control"],
        http=service.Http(lambda svc: svc.app(), host="127.0.0.1", port=0),
        on_started=started,
    )
    await asker
    assert answers == [{"started": True}]
    assert log == ["start", "stop"]
    asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)


async def test_interrupt_lets_the_work_in_progress_finish(tmp_path: Path) -> None:
    log: list[str] = []
    stop = asyncio.Event()
    built: asyncio.Queue[Recording] = asyncio.Queue()

    def build(bus: Bus) -> Recording:
        svc = Recording(log, bus)
        built.put_nowait(svc)
        return svc

    def interrupt(svc: Recording) -> None:
        svc.stop_requested.set()

    runner = asyncio.create_task(
        service.serve(
            _settings(tmp_path), build, name="test", until=lambda s: s.run(), interrupt=interrupt, stop=stop
        )
    )
    await (await built.get()).started.wait()
    stop.set()
    await runner
    assert log == ["start", "finished the step in progress", "stop"]


async def test_a_bus_that_cannot_start_is_a_one_line_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, bus="kafka", kafka_bootstrap="127.0.0.1:1")
    built: list[object] = []
    with pytest.raises(service.ServiceStartError, match=r"^test: cannot start the kafka bus: ") as caught:
        await service.serve(settings, lambda bus: built.append(bus) or Recording([], bus), name="test")
    assert "\n" not in str(caught.value)
    assert built == []  # nothing was built on a bus that is not there


async def test_an_idle_connection_stays_open_past_a_clients_pool_expiry() -> None:
    """A pooled connection left idle for longer than the clients' pool expiry (httpx's and openai's: 5 s)
    is still served, not closed by the server: a server that closes idle connections at the same moment
    the client reuses one fails that request with a ``ReadError`` (uvicorn's default keep-alive, 5 s).
    Same connection before and after the pause (the same client port), on every service's server and on
    the gateway's (its own HTTP protocol)."""
    ports: dict[str, list[int]] = {}

    def app(name: str) -> Any:
        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            ports.setdefault(name, []).append(scope["client"][1])
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        return asgi

    servers = {"service": service.HttpServer(app("service")), "gateway": GatewayServer(app("gateway"))}
    urls = {name: await server.start() for name, server in servers.items()}
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(keepalive_expiry=30.0)) as client:
            for url in urls.values():
                assert (await client.get(url)).status_code == 204
            await asyncio.sleep(6.0)
            for url in urls.values():
                assert (await client.get(url)).status_code == 204
    finally:
        for server in servers.values():
            await server.stop()
    for name in servers:
        assert len(ports[name]) == 2 and ports[name][0] == ports[name][1], ports
