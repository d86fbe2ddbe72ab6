"""The thin FastAPI app of ``flywheel agl-server``: key check, parse, call the service, answer.

Errors keep AGL's shape (``{"detail": "..."}``, FastAPI's 422 for a body that does not validate) so
AGL's clients read them unchanged. The key is accepted as ``Authorization: Bearer <key>`` or
``x-api-key``; a missing or wrong key is 401 on every route except ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.agl.models import (
    Event,
    EventCreate,
    Model,
    PauseRequest,
    PauseState,
    Rollout,
    RolloutCreate,
    RolloutDetail,
    RolloutPatch,
    RolloutState,
    TerminalPage,
)
from gateway.agl.proxy import AglProxy
from gateway.agl.serving import AglError, AglService
from gateway.body import BodyLimit
from gateway.serving import StreamAnswer
from infra.http import bearer_token, token_matches
from infra.logging import get_logger

log = get_logger("gateway.agl")

KeyLookup = Callable[[str], str | None]  # key → tenant (None: not a key of this server)


def tenant_lookup(main_key: str, others: KeyLookup | None = None) -> KeyLookup:
    """``main_key`` is tenant ``default``; ``others`` (the gateway's hashed key store) adds tenants."""

    def lookup(key: str) -> str | None:
        if token_matches(key, main_key):
            return "default"
        return others(key) if others is not None else None

    return lookup


def _tenant(request: Request) -> str:
    keys: KeyLookup = request.app.state.agl_keys
    candidates = [bearer_token(request.headers), request.headers.get("x-api-key", "")]
    for key in candidates:
        if key and (found := keys(key)) is not None:
            return found
    raise AglError(401, "Invalid or missing API key")


Tenant = Annotated[str, Depends(_tenant)]


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_agl_app(
    service: AglService, proxy: AglProxy, keys: KeyLookup, *, max_body_bytes: int = 8 * 1024 * 1024
) -> FastAPI:
    app = FastAPI(title="Flywheel agl-server (Agent Lightning 1.0 API)", version="1.0.0")
    app.state.agl = service
    app.state.agl_keys = keys

    @app.exception_handler(AglError)
    async def _agl_error(_: Request, exc: AglError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("agl.unhandled", error_type=type(exc).__name__, error=str(exc)[:500])
        return JSONResponse({"detail": "Internal server error"}, status_code=500)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(_api_router(service))
    _proxy_routes(app, service, proxy)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def _api_router(service: AglService) -> APIRouter:
    """``/api``: rollouts, their events, and the models AGL's trainer registers."""
    api = APIRouter(prefix="/api")

    @api.post("/rollouts", status_code=201, response_model=list[Rollout])
    async def create_rollouts(body: list[RolloutCreate], t: Tenant) -> list[Rollout]:
        return await service.create_rollouts(t, body)

    @api.get("/rollouts", response_model=list[Rollout])
    async def list_rollouts(
        state_in: Annotated[list[RolloutState], Query()], t: Tenant, limit: int = 500
    ) -> list[Rollout]:
        return service.list_rollouts(t, state_in, limit)

    @api.get("/rollouts/terminal", response_model=TerminalPage)
    async def terminal(t: Tenant, after: int = 0, limit: int = 1000) -> TerminalPage:
        return service.terminal_page(t, after, limit)

    @api.get("/rollouts/{rollout_id}", response_model=RolloutDetail)
    async def get_rollout(rollout_id: str, t: Tenant) -> RolloutDetail:
        return service.get_rollout(t, rollout_id)

    @api.patch("/rollouts/{rollout_id}", response_model=Rollout)
    async def patch_rollout(rollout_id: str, body: RolloutPatch, t: Tenant) -> Rollout:
        return await service.patch_rollout(t, rollout_id, body)

    @api.delete("/rollouts/{rollout_id}", status_code=204)
    async def delete_rollout(rollout_id: str, t: Tenant) -> Response:
        await service.delete_rollout(t, rollout_id)
        return Response(status_code=204)

    @api.post("/rollouts/{rollout_id}/attempt/{attempt_id}/events", response_model=Event)
    async def post_event(rollout_id: str, attempt_id: str, body: EventCreate, t: Tenant) -> Event:
        return await service.post_event(t, rollout_id, attempt_id, body.event_type, body.data)

    @api.get("/rollouts/{rollout_id}/events", response_model=list[Event])
    async def query_events(
        rollout_id: str,
        t: Tenant,
        event_type: str | None = None,
        format: str | None = None,
        include_routed_experts: bool = True,
    ) -> list[Event]:
        return service.query_events(
            t,
            rollout_id,
            event_type=event_type,
            triplet=format == "triplet",
            routed_experts=include_routed_experts,
        )

    @api.post("/models", status_code=201, response_model=list[Model])
    async def register_models(body: list[Model], t: Tenant) -> list[Model]:
        return await service.register_models(t, body)

    @api.delete("/models")
    async def clear_models(t: Tenant) -> dict[str, str]:
        await service.clear_models(t)
        return {"status": "ok"}

    return api


def _proxy_routes(app: FastAPI, service: AglService, proxy: AglProxy) -> None:
    """``/proxy``: the agent's model calls (recorded as the gateway records them), pause and resume."""

    @app.post("/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:path}")
    async def llm_proxy(
        rollout_id: str, attempt_id: str, mode: str, path: str, request: Request, t: Tenant
    ) -> Response:
        raw = await request.body()
        # An agent that hangs up abandons its call: the upstream request is cancelled and nothing is
        # recorded for it (AGL answers 499 the same way), so a retried call is not counted twice.
        serving = asyncio.create_task(proxy.serve(t, rollout_id, attempt_id, mode, path, raw))
        gone = asyncio.create_task(_disconnected(request))
        try:
            done, _ = await asyncio.wait((serving, gone), return_when=asyncio.FIRST_COMPLETED)
            if serving not in done:
                return Response(status_code=499)
            answer = serving.result()
        finally:
            for task in (serving, gone):
                task.cancel()
            await asyncio.gather(serving, gone, return_exceptions=True)
        headers = {"x-flywheel-call": answer.call_id}
        if isinstance(answer, StreamAnswer):
            return StreamingResponse(
                answer.chunks,
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return Response(answer.body, media_type="application/json", headers=headers)

    @app.post("/proxy/pause", response_model=PauseState)
    async def pause(body: PauseRequest, t: Tenant) -> PauseState:
        return await service.pause(t, body)

    @app.post("/proxy/resume", response_model=PauseState)
    async def resume(t: Tenant) -> PauseState:
        return await service.resume(t)

    @app.get("/proxy/state", response_model=PauseState)
    async def state(t: Tenant) -> PauseState:
        return service.pause_state(t)
