"""Wires the gateway: ``create_app(settings, bus, upstreams, *, keystore=None) -> FastAPI``, or
``build(settings, bus, upstreams) -> Gateway`` and ``app_for(gateway, lifespan=False)`` when the host
starts and stops the service itself (``flywheel gateway``, through ``infra.service.serve``).

    app = create_app(settings, bus, [make_upstream("http://127.0.0.1:8000/v1")])
    gateway = app.state.gateway            # gateway.service.Gateway: start()/stop(), pause(), state()

The app's lifespan starts and stops the gateway (subscriptions, spool drainer, session reaper). A host
that drives the ASGI app without lifespan events (``httpx.ASGITransport``) calls
``await app.state.gateway.start()`` / ``stop()`` itself. ``gateway.server.GatewayServer`` serves the app
with uvicorn on a loopback port inside a running event loop (tests, ``flywheel record``, the stack).

The LLM-call routes are served by :class:`HotCalls` ahead of FastAPI's middleware stack (same handler,
same errors, same body limit, less per-request work); FastAPI still lists them in the OpenAPI spec and
serves everything else.

Errors: every failure is a :class:`gateway.errors.GatewayError` (tree in ``gateway/errors.py``), turned
into an OpenAI-format error body by one handler; FastAPI's own validation and routing errors are
translated to the same shape; anything else is a 500 ``server_error`` and logged.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from gateway.body import BodyLimit, Disconnected, check_length, read_body
from gateway.errors import GatewayError
from gateway.keys import KeyStore
from gateway.protocols.dialects import Route, error_response
from gateway.routes import build_router, call_response, serve_call
from gateway.service import Gateway
from gateway.serving import Answer
from gateway.settings import GatewaySettings
from gateway.spans.intake import SpanIntake, build_otlp_router
from gateway.upstream.client import Upstream
from infra.bus.base import Bus
from infra.http import install_error_handlers
from infra.logging import get_logger
from infra.origin import HostPolicy, OriginGuard

log = get_logger("gateway.app")


def default_keystore(settings: GatewaySettings) -> KeyStore:
    """Where ``flywheel keys`` keeps the hashed keys: ``<data_dir>/gateway/keys.json``."""
    return KeyStore(settings.data_dir / "gateway" / "keys.json")


def build(
    settings: GatewaySettings,
    bus: Bus,
    upstreams: Sequence[Upstream],
    *,
    keystore: KeyStore | None = None,
    release_slots: Sequence[Upstream] = (),
) -> Gateway:
    """The gateway service (``start()``/``stop()``); :func:`app_for` is its HTTP face."""
    keys = keystore or default_keystore(settings)
    return Gateway(settings, bus, upstreams, keystore=keys, release_slots=release_slots)


def create_app(
    settings: GatewaySettings,
    bus: Bus,
    upstreams: Sequence[Upstream],
    *,
    keystore: KeyStore | None = None,
    lifespan: bool = True,
) -> FastAPI:
    return app_for(build(settings, bus, upstreams, keystore=keystore), lifespan=lifespan)


def app_for(gateway: Gateway, *, lifespan: bool = True) -> FastAPI:
    """The gateway's ASGI app; with ``lifespan`` the app starts and stops ``gateway`` itself."""
    settings = gateway.settings

    @asynccontextmanager
    async def _lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = GatewayApp(
        title="Flywheel gateway",
        version="1",
        lifespan=_lifespan if lifespan else None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = gateway
    app.state.span_intake = SpanIntake(gateway, settings.otlp_max_body_bytes)  # OTLP: gateway/spans/intake.py
    app.include_router(build_router())
    app.include_router(build_otlp_router())
    install_error_handlers(app, unexpected="internal gateway error")
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # Host/Origin checks (DNS rebinding, cross-site forms) on the admin routes and the web view only:
    # agents reach the LLM-call routes under any name (infra/origin.py)
    policy = HostPolicy.for_server(settings.gateway_host, settings.allowed_hosts)
    app.add_middleware(OriginGuard, policy=policy, prefixes=ADMIN_PREFIXES)
    app.hot = HotCalls(gateway, settings.max_body_bytes)  # the LLM calls, ahead of the stack above
    return app


ADMIN_PREFIXES = ("/admin", "/ui")
_HOT_PATH = re.compile(r"^(?:/episodes/([^/]+))?/v1/(chat/completions|completions|responses|messages)$")
_ENDPOINTS: dict[str, Route] = {
    "chat/completions": "chat.completions",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
}


class GatewayApp(FastAPI):
    """FastAPI, except that the LLM-call routes are answered before its middleware stack (HotCalls)."""

    hot: HotCalls | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot
        if hot is not None and scope["type"] == "http" and scope["method"] == "POST":
            match = hot.match(scope)
            if match is not None:
                scope["app"] = self
                await hot(match, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class HotCalls:
    """The LLM-call routes (``POST [/episodes/{id}]/v1/{chat/completions,completions}``) straight from
    the ASGI server to ``routes.serve_call``, without FastAPI's per-request machinery: its middleware
    stack (error, telemetry and body-limit wrappers), route scan, dependency solving, ``Request`` and
    ``Response`` objects (in process, upstream canned: 0.23 ms of CPU a call here against 0.30 ms as a
    middleware inside FastAPI and 0.43 ms through the routes). Same handler, same responses, the same
    OpenAI-format errors (and the same body limit) as the FastAPI routes, which stay in the app for the
    OpenAPI spec; FastAPI's native OpenTelemetry middleware does not see these calls (the gateway's own
    metrics do).
    """

    def __init__(self, gateway: Gateway, max_body_bytes: int) -> None:
        self.gateway = gateway
        self.max_body_bytes = max_body_bytes

    @staticmethod
    def match(scope: Scope) -> re.Match[str] | None:
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return _HOT_PATH.match(path)

    async def __call__(self, match: re.Match[str], scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = _ENDPOINTS[match[2]]
        try:
            check_length(scope, self.max_body_bytes)  # before the key is checked, as the routes do
            episode, answer = await serve_call(
                self.gateway,
                endpoint,
                match[1],
                Headers(scope=scope),
                lambda: read_body(scope, receive, self.max_body_bytes),
            )
        except Disconnected:
            return
        except GatewayError as exc:
            await error_response(endpoint, exc)(scope, receive, send)  # in the protocol's error format
            return
        except Exception as exc:
            log.error("unhandled error", error_type=type(exc).__name__, error=str(exc)[:500])
            unexpected = GatewayError("internal gateway error", code=None)
            await error_response(endpoint, unexpected)(scope, receive, send)
            return
        if isinstance(answer, Answer):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(answer.body)),
                        (b"x-flywheel-episode", episode.episode_id.encode("latin-1")),
                        (b"x-flywheel-call", answer.call_id.encode("latin-1")),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": answer.body})
        else:
            await call_response(episode, answer)(scope, receive, send)
