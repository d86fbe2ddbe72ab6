"""Running a service alone: one way for all of them (``flywheel gateway|worker|reward|trainer|recorder|
otel-export``).

``flywheel/alone.py`` hands :func:`serve` the settings and a ``build`` (the part as
``flywheel/assembly.py`` builds it for every entry point, from the service's own
``app.py::build``), and :func:`serve` does the rest, in this order:

1. the Prometheus endpoint on ``metrics_port``, when one is set (the service's own registry, or the
   process's default);
2. the configured bus (``infra.bus.factory.make_bus``), started, and its topics ensured;
3. ``build(bus)`` and the service's ``start()``;
4. an HTTP app on ``http``, when the service serves one (uvicorn in this loop, :class:`HttpServer`);
5. then it waits for SIGINT/SIGTERM, or for ``until`` (the trainer's step loop) to return;
6. and stops in reverse order: the HTTP server (in-flight requests finish), the service's ``stop()``
   (a worker drains its episodes, the trainer checkpoints), the bus.

A bus that cannot start is a one-line :class:`ServiceStartError`, not a traceback.

:func:`run` is ``asyncio.run`` on uvloop where it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast

import uvicorn
from starlette.types import ASGIApp

from infra.bus.base import Bus
from infra.bus.factory import make_bus
from infra.logging import get_logger
from infra.settings import FlywheelSettings

log = get_logger(__name__)
T = TypeVar("T")
KEEP_ALIVE_S = 75  # an idle HTTP/1.1 connection's life on the server side (see HttpServer)


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


class ServiceStartError(RuntimeError):
    """The service could not start (its bus, its port); the message is one line for the CLI."""


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on uvloop when it is installed (a gateway's calls are mostly loop and
    socket work, which uvloop does in C: docs/results/tuning.md has the gain)."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.run(main)
    return cast(T, uvloop.run(main))


class HttpServer:
    """uvicorn serving ``app`` inside the running loop (a background task); the host owns the signals.

    server = HttpServer(app, host="127.0.0.1", port=0)   # port 0: pick a free port
    url = await server.start()                           # "http://127.0.0.1:PORT"
    ...
    await server.stop()                                  # in-flight requests finish (5 s at most)
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        http: Any = "auto",
        lifespan: Literal["auto", "on", "off"] = "on",
    ) -> None:
        config = uvicorn.Config(
            app,
            http=http,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            proxy_headers=False,  # the client is the direct peer (the token throttles key on it)
            lifespan=lifespan,
            timeout_graceful_shutdown=5,
            # Longer than clients keep an idle pooled connection (httpx and openai: 5 s, uvicorn's own
            # default too): the client then drops it first, instead of the server closing it just as
            # the client sends its next request on it (a ReadError for that request).
            timeout_keep_alive=KEEP_ALIVE_S,
            loop="asyncio",
        )
        self.server = uvicorn.Server(config)
        self.host = host
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self, timeout_s: float = 30.0) -> str:
        # uvicorn captures SIGINT/SIGTERM while serving in the main thread; the host owns signals here.
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self._task = asyncio.create_task(self.server.serve(), name="uvicorn")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.server.started:
            if self._task.done():
                self._task.result()
                raise ServiceStartError("the HTTP server exited before it started")
            if asyncio.get_running_loop().time() > deadline:
                raise ServiceStartError("the HTTP server did not start")
            await asyncio.sleep(0.01)
        sock = self.server.servers[0].sockets[0]
        port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


@dataclass
class Http:
    """The HTTP app a service serves, and where (``serve`` builds the app once the service is built)."""

    app: Callable[[Any], ASGIApp]  # the built service → its ASGI app
    host: str
    port: int
    protocol: Any = "auto"  # uvicorn's ``http`` (the gateway's own protocol class: header limits)


async def serve(
    settings: FlywheelSettings,
    build: Callable[[Bus], S | Awaitable[S]],
    *,
    name: str,
    topics: Sequence[str] = (),
    metrics_port: int | None = None,
    registry: Callable[[S], Any] | None = None,
    http: Http | None = None,
    until: Callable[[S], Awaitable[object]] | None = None,
    interrupt: Callable[[S], None] | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[S, str], None] | None = None,
) -> None:
    """Run one service until SIGINT/SIGTERM (or ``stop``), or until ``until(service)`` returns.

    A signal while ``until`` runs calls ``interrupt(service)`` and lets ``until`` finish (the trainer's
    step in progress completes); without ``interrupt`` it is cancelled.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    bus = make_bus(settings)
    try:
        await bus.start()
        if topics:
            await bus.ensure_topics(list(topics))
    except Exception as exc:
        await _quietly(bus.stop())
        raise ServiceStartError(
            f"{name}: cannot start the {settings.bus} bus: {type(exc).__name__}: {exc}"
        ) from exc
    server: HttpServer | None = None
    service: S | None = None
    try:
        built = build(bus)
        service = await built if isinstance(built, Awaitable) else built
        if metrics_port:
            from prometheus_client import REGISTRY, start_http_server

            start_http_server(metrics_port, registry=registry(service) if registry else REGISTRY)
        await service.start()
        url = ""
        if http is not None:
            server = HttpServer(http.app(service), host=http.host, port=http.port, http=http.protocol)
            url = await server.start()
        log.info("service_started", service=name, url=url or None)
        if on_started is not None:
            on_started(service, url)
        work = until(service) if until is not None else None
        await _wait(stop, work, (lambda: interrupt(service)) if interrupt is not None and service else None)
    finally:
        if server is not None:
            await server.stop()
        if service is not None:
            await service.stop()
        await bus.stop()
        log.info("service_stopped", service=name)


async def _wait(
    stop: asyncio.Event, work: Awaitable[object] | None, interrupt: Callable[[], None] | None
) -> None:
    """Until ``stop`` is set or ``work`` finishes (its error, if any, is raised)."""
    stopper = asyncio.ensure_future(stop.wait())
    runner = asyncio.ensure_future(work) if work is not None else None
    try:
        await asyncio.wait({stopper} | ({runner} if runner else set()), return_when=asyncio.FIRST_COMPLETED)
        if runner is None:
            return
        if not runner.done():
            if interrupt is None:
                runner.cancel()
            else:
                interrupt()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    finally:
        stopper.cancel()


async def _quietly(awaitable: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):
        await awaitable
