"""Thin FastAPI routers: authenticate, parse, call the service, shape the HTTP response."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.body import parse_json
from gateway.episodes.registry import EpisodeState
from gateway.errors import AuthenticationError, GatewayError, ServiceUnavailableError, ValidationFailedError
from gateway.protocol import (
    AglEventRequest,
    ChatCompletionRequest,
    CompletionRequest,
    FeedbackRequest,
    FinishEpisodeRequest,
    OpenEpisodeRequest,
    PauseRequest,
    ResumeRequest,
    RewardRequest,
    openapi_body,
    validate,
)
from gateway.protocols.anthropic import MessagesExchange, MessagesRequest
from gateway.protocols.dialects import Route, error_response
from gateway.protocols.responses import ResponsesExchange, ResponsesRequest
from gateway.release_routes import release_routes
from gateway.service import Gateway
from gateway.serving import Answer, Call, StreamAnswer
from infra.http import bearer_token, token_matches
from infra.http import require_admin as admin_check
from schemas import AglRecorded

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_MODELS: dict[Route, type[Any]] = {
    "chat.completions": ChatCompletionRequest,
    "completions": CompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _bearer(headers: Mapping[str, str]) -> str | None:
    return bearer_token(headers, "x-api-key") or None


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def tenant_of(request: Request) -> str:
    return tenant_for_key(_gw(request), _bearer(request.headers))


def tenant_for_key(gw: Gateway, key: str | None) -> str:
    if key is None:
        raise AuthenticationError("missing API key (Authorization: Bearer <key>)", code="missing_api_key")
    tenant = gw.keystore.tenant_for(key) if gw.keystore is not None else None
    if tenant is None:
        raise AuthenticationError("invalid API key", code="invalid_api_key")
    return tenant


def require_admin(request: Request) -> None:
    """The admin token, throttled per client address (``infra.http.require_admin``)."""
    admin_check(request, _gw(request).settings.admin_token.get_secret_value())


def _parse(raw: bytes, endpoint: Route) -> tuple[dict[str, Any], Any]:
    """The call's body as JSON and as its endpoint's request model: parsed and validated once, here."""
    data = parse_json(raw)
    request = validate(_MODELS[endpoint], data)  # a JSON object, or it raised
    return cast(dict[str, Any], data), request


async def serve_call(
    gw: Gateway,
    endpoint: Route,
    episode_id: str | None,
    headers: Mapping[str, str],
    read_body: Callable[[], Awaitable[bytes]],
) -> tuple[EpisodeState, Answer | StreamAnswer]:
    """One LLM call: a training episode's (``episode_id``) or production traffic (tenant key).

    Free of the HTTP framework: ``handle_call`` (the FastAPI routes) and ``gateway.app.HotCalls`` (the
    same paths straight from the ASGI server) both end here and only shape the answer differently.
    A production call is authenticated and held to its tenant's quotas before its body is read (a
    429 past one, gateway/quotas.py); a training call's episode is found (or a 404) before it is read. A Responses or Messages API call is
    served as the chat call its exchange translates it into (gateway/protocols/dialects.py).
    """
    if not gw.caught_up.is_set():  # only right after start (see Gateway._catch_up)
        await gw.wait_caught_up()
    if episode_id is not None:
        episode = await gw.training_episode(episode_id)  # an unknown one is a 404 before its body is read
        raw = await read_body()
        data, request = _parse(raw, endpoint)
    else:
        tenant = tenant_for_key(gw, _bearer(headers))
        gw.quotas.admit(tenant)  # its requests and tokens per minute, before any work (gateway/quotas.py)
        raw = await read_body()
        data, request = _parse(raw, endpoint)
        session = _session_of(headers, data)
        if session is None and endpoint == "responses":
            session = gw.responses.session_of(tenant, data)  # a previous response's session continues
        episode = await gw.sessions.episode(tenant, session)
    if endpoint == "responses":
        exchange: ResponsesExchange | MessagesExchange = ResponsesExchange(
            data, episode, gw.responses, request
        )
    elif endpoint == "messages":
        exchange = MessagesExchange(data, request)
    else:
        return episode, await gw.calls.serve(Call(episode, endpoint, raw, data))
    return episode, await gw.calls.serve(Call(episode, "chat.completions", raw, exchange.chat, exchange))


def call_headers(episode: EpisodeState, answer: Answer | StreamAnswer) -> dict[str, str]:
    return {"X-Flywheel-Episode": episode.episode_id, "X-Flywheel-Call": answer.call_id}


def call_response(episode: EpisodeState, answer: Answer | StreamAnswer) -> Response:
    headers = call_headers(episode, answer)
    if isinstance(answer, Answer):
        return Response(answer.body, media_type="application/json", headers=headers)
    return StreamingResponse(
        answer.chunks, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
    )


async def handle_call(request: Request, endpoint: Route, episode_id: str | None) -> Response:
    """The FastAPI routes' way into :func:`serve_call`; errors in the protocol's own format."""
    try:
        episode, answer = await serve_call(_gw(request), endpoint, episode_id, request.headers, request.body)
    except GatewayError as exc:
        return error_response(endpoint, exc)
    return call_response(episode, answer)


def _session_of(headers: Mapping[str, str], data: dict[str, Any]) -> str | None:
    header = headers.get("x-flywheel-session")
    if header:
        return header[:256]
    meta = data.get("metadata")
    if isinstance(meta, dict):
        for key in ("session_id", "session", "conversation_id"):
            if isinstance(meta.get(key), str) and meta[key]:
                return str(meta[key])[:256]
    user = data.get("user")
    return user[:256] if isinstance(user, str) and user else None


async def record_agl_event(gw: Gateway, state: EpisodeState, body: AglEventRequest) -> dict[str, Any]:
    """An Agent Lightning agent's event, posted to the ``AGL_EVENT_URL`` its Kubernetes Job was given.

    Every event is kept as ``AglRecorded`` (kind ``event``, the episode standing in for AGL's rollout,
    attempt ``"0"``); a ``reward`` event is also the episode's agent-reported reward, so its
    ``data.value`` must be a finite number (AGL leaves it unchecked; a reward that cannot score is a
    422 here, not an event that silently scores nothing). The answer is AGL's ``Event``.
    """
    recorded = AglRecorded(
        producer=f"gateway:{gw.id}",
        scope=state.episode_id,
        tenant=state.tenant or "default",
        kind="event",
        rollout_id=state.episode_id,
        attempt_id="0",
        episode_id=state.episode_id,
        data={"event_type": body.event_type, "data": body.data},
    )
    if body.event_type == "reward":
        value = body.data.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValidationFailedError(
                "a reward event needs data.value, a finite number", code="invalid_reward", param="data.value"
            )
        message = body.data.get("message")
        reward = RewardRequest(value=float(value), message=message[:8192] if isinstance(message, str) else "")
        await gw.report_reward(state, reward)
    await gw.publish(recorded)
    return {
        "event_type": body.event_type,
        "rollout_id": state.episode_id,
        "attempt_id": "0",
        "timestamp": recorded.emitted_at.timestamp(),
        "data": body.data,
    }


def build_router() -> APIRouter:
    """Every route of the gateway but the OTLP intake's (``gateway/spans/intake.py``)."""
    router = APIRouter()
    bodies = {route: openapi_body(model) for route, model in _MODELS.items()}
    _episode_routes(router, bodies)
    _production_routes(router, bodies)
    _operation_routes(router)
    _admin_routes(router)
    release_routes(router)
    return router


def _episode_routes(router: APIRouter, bodies: Mapping[Route, dict[str, Any]]) -> None:
    """Training episodes: the episode's URL (its id, or its signed ticket) is the capability."""
    chat_body, completion_body = bodies["chat.completions"], bodies["completions"]
    responses_body, messages_body = bodies["responses"], bodies["messages"]

    @router.post("/episodes/{episode_id}/v1/chat/completions", openapi_extra=chat_body, tags=["episodes"])
    async def episode_chat(episode_id: str, request: Request) -> Response:
        return await handle_call(request, "chat.completions", episode_id)

    @router.post("/episodes/{episode_id}/v1/completions", openapi_extra=completion_body, tags=["episodes"])
    async def episode_completions(episode_id: str, request: Request) -> Response:
        return await handle_call(request, "completions", episode_id)

    @router.post("/episodes/{episode_id}/v1/responses", openapi_extra=responses_body, tags=["episodes"])
    async def episode_responses(episode_id: str, request: Request) -> Response:
        return await handle_call(request, "responses", episode_id)

    @router.post("/episodes/{episode_id}/v1/messages", openapi_extra=messages_body, tags=["episodes"])
    async def episode_messages(episode_id: str, request: Request) -> Response:
        return await handle_call(request, "messages", episode_id)

    @router.get("/episodes/{episode_id}/v1/models", tags=["episodes"])
    async def episode_models(episode_id: str, request: Request) -> Response:
        gw = _gw(request)
        await gw.training_episode(episode_id)
        return _json(_models(gw))

    @router.post("/episodes/{episode_id}/reward", tags=["episodes"])
    async def episode_reward(episode_id: str, body: RewardRequest, request: Request) -> Response:
        gw = _gw(request)
        event = await gw.report_reward(await gw.training_episode(episode_id), body)
        return _json({"ok": True, "event_id": event.event_id})

    @router.post("/episodes/{episode_id}/agl/events", tags=["episodes"])
    async def episode_agl_event(episode_id: str, body: AglEventRequest, request: Request) -> Response:
        gw = _gw(request)
        return _json(await record_agl_event(gw, await gw.training_episode(episode_id), body))


def _production_routes(router: APIRouter, bodies: Mapping[Route, dict[str, Any]]) -> None:
    """Production traffic: a tenant's key."""
    chat_body, completion_body = bodies["chat.completions"], bodies["completions"]
    responses_body, messages_body = bodies["responses"], bodies["messages"]

    @router.post("/v1/chat/completions", openapi_extra=chat_body, tags=["production"])
    async def chat(request: Request) -> Response:
        return await handle_call(request, "chat.completions", None)

    @router.post("/v1/completions", openapi_extra=completion_body, tags=["production"])
    async def completions(request: Request) -> Response:
        return await handle_call(request, "completions", None)

    @router.post("/v1/responses", openapi_extra=responses_body, tags=["production"])
    async def responses(request: Request) -> Response:
        return await handle_call(request, "responses", None)

    @router.post("/v1/messages", openapi_extra=messages_body, tags=["production"])
    async def messages(request: Request) -> Response:
        return await handle_call(request, "messages", None)

    @router.get("/v1/models", tags=["production"])
    async def models(request: Request) -> Response:
        tenant_of(request)
        return _json(_models(_gw(request)))

    @router.post("/v1/feedback", tags=["production"])
    async def feedback(body: FeedbackRequest, request: Request) -> Response:
        tenant = tenant_of(request)
        event, is_open = await _gw(request).sessions.feedback(tenant, body)
        # an ended session is re-scored with this feedback (a new EpisodeScored, one revision up)
        return _json(
            {
                "ok": True,
                "event_id": event.event_id,
                "episode_id": event.episode_id,
                "session_open": is_open,
                "rescore": not is_open,
            }
        )

    @router.post("/v1/sessions/{session_id}/end", tags=["production"])
    async def end_session(session_id: str, request: Request) -> Response:
        tenant = tenant_of(request)
        episode_id = await _gw(request).sessions.end(tenant, session_id)
        return _json({"ok": True, "episode_id": episode_id})


def _operation_routes(router: APIRouter) -> None:
    @router.get("/healthz", tags=["operations"])
    async def healthz() -> Response:
        return _json({"ok": True})

    @router.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> Response:
        gw = _gw(request)
        if not gw.started:
            raise ServiceUnavailableError("gateway not started", code="not_ready")
        if gw.starting:
            raise ServiceUnavailableError(
                f"still starting: {', '.join(sorted(gw.starting))}", code="not_ready"
            )
        return _json({"ok": True})  # what it serves and holds: /admin/state, behind the admin token

    @router.get("/metrics", tags=["operations"])
    async def metrics(request: Request) -> Response:
        """Prometheus text; the scrape-only ``FLYWHEEL_METRICS_TOKEN`` or the admin token as a bearer."""
        gw = _gw(request)
        scrape = gw.settings.metrics_token.get_secret_value()
        if not (scrape and token_matches(bearer_token(request.headers), scrape)):
            require_admin(request)  # metrics name tenants, episodes in flight and the served versions
        gw.metrics.spool_depth.set(gw.recorder.spool_depth)
        gw.metrics.in_flight.set(gw.admission.in_flight)
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")


def _admin_routes(router: APIRouter) -> None:
    """Operator routes (the admin token)."""

    @router.post("/admin/pause", tags=["admin"])
    async def pause(request: Request, body: PauseRequest | None = None) -> Response:
        require_admin(request)
        body = body or PauseRequest()
        result = await _gw(request).pause(body.version, body.drain_timeout_s)
        return _json(
            {
                "paused": True,
                "version": result.version,
                "waited_ms": result.waited_ms,
                "timed_out": result.timed_out,
                "in_flight": result.in_flight,
                "still_in_flight": result.still_in_flight,
            }
        )

    @router.post("/admin/resume", tags=["admin"])
    async def resume(request: Request, body: ResumeRequest | None = None) -> Response:
        require_admin(request)
        version = await _gw(request).resume((body or ResumeRequest()).version)
        return _json({"paused": False, "weight_version": version})

    @router.get("/admin/state", tags=["admin"])
    async def state(request: Request) -> Response:
        require_admin(request)
        return _json(_gw(request).state())

    @router.post("/admin/episodes", tags=["admin"])
    async def open_episode(request: Request, body: OpenEpisodeRequest | None = None) -> Response:
        require_admin(request)
        gw = _gw(request)
        ep = await gw.open_training(body or OpenEpisodeRequest())
        base = (gw.settings.public_url or str(request.base_url)).rstrip("/")
        return _json(
            {"episode_id": ep.episode_id, "base_url": f"{base}/episodes/{gw.episode_segment(ep)}/v1"}, 201
        )

    @router.get("/admin/episodes", tags=["admin"])
    async def list_episodes(request: Request) -> Response:
        require_admin(request)
        return _json({"episodes": [s.summary() for s in _gw(request).episodes.open_episodes()[-1000:]]})

    @router.get("/admin/episodes/{episode_id}", tags=["admin"])
    async def show_episode(episode_id: str, request: Request) -> Response:
        require_admin(request)
        described = _gw(request).describe_episode(episode_id)
        intake = getattr(request.app.state, "span_intake", None)  # the agent's own spans (OTLP intake)
        if intake is not None:
            described["spans"] = [span.model_dump(mode="json") for span in intake.recent(episode_id)]
        return _json(described)

    @router.post("/admin/episodes/{episode_id}/finish", tags=["admin"])
    async def finish_episode(
        episode_id: str, request: Request, body: FinishEpisodeRequest | None = None
    ) -> Response:
        require_admin(request)
        await _gw(request).finish_episode(episode_id, body or FinishEpisodeRequest())
        return _json({"ok": True})


def _models(gw: Gateway) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": gw.settings.model, "object": "model", "owned_by": "flywheel"}]}
