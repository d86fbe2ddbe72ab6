"""FastAPI app factory: vLLM's OpenAI-compatible endpoints and dev endpoints over an ``InferenceEngine``.

``create_engine_app(engine)`` works in-process (``httpx.ASGITransport(app)``, no network hop) or behind
uvicorn (``flywheel engine``). One exception handler turns every error into an OpenAI-format body:
bad input → 400, a failed weight load → 400 (old weights keep serving), anything else → 500.

Dev endpoints (as vLLM's with ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort|wait|keep``,
``POST /resume``, ``GET /is_paused``; plus ``POST /load_weights {"path", "version"}``, ``POST /load_adapter
{"name", "path", "version"}`` (a LoRA adapter served as model ``name``: infra/engine/adapters.py), ``GET /health``,
``GET /version``. With ``admin_token`` set, pause/resume/load_weights need ``Authorization: Bearer``;
an address that sent a wrong token ``infra.http.ADMIN_FAILURES_PER_MINUTE`` times in a minute gets a 429
(``infra/throttle.py``). Every body is bounded at ``MAX_BODY_BYTES`` before a route reads it
(``infra/body.py``: by its Content-Length, or counted when chunked).
"""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from infra.body import BodyBound
from infra.engine.core import EngineStepError, InferenceEngine
from infra.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    LoadAdapterRequest,
    LoadWeightsRequest,
)
from infra.engine.sampling import InvalidRequestError
from infra.engine.serving import EngineServing
from infra.engine.weight_loading import WeightLoadError
from infra.http import (
    ADMIN_FAILURES_PER_MINUTE,
    HttpError,
    admin_token_problem,
    bearer_token,
    error_response,
    validation_message,
)
from infra.throttle import FailureThrottle

MAX_BODY_BYTES = 16 * 1024 * 1024


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """vLLM's flavour of the OpenAI error body (``type`` such as ``BadRequestError``, ``code`` the status)."""
    return error_response(status, message, kind, code=status, param=param)


def _too_large(max_bytes: int) -> bytes:
    return bytes(_error(413, f"request body larger than {max_bytes} bytes", "BadRequestError").body)


def _package_version() -> str:
    try:
        return version("flywheel")
    except PackageNotFoundError:
        return "unknown"


def create_engine_app(
    engine: InferenceEngine, *, tool_parser: str | None = "hermes", admin_token: str | None = None
) -> FastAPI:
    """The HTTP face of ``engine``; closing the app does not close the engine (its owner does)."""
    app = FastAPI(title="Flywheel embedded inference engine", docs_url=None, redoc_url=None)
    serving = EngineServing(engine, tool_parser=tool_parser)
    app.state.engine = engine
    app.state.serving = serving

    app.add_middleware(BodyBound, max_bytes=MAX_BODY_BYTES, answer=_too_large)
    throttle = FailureThrottle(limit=ADMIN_FAILURES_PER_MINUTE)

    def admin(request: Request) -> None:
        if not admin_token:
            return
        client = request.client.host if request.client else ""
        given = bearer_token(request.headers)
        problem = admin_token_problem(given, admin_token, throttle=throttle, client=client)
        if problem is not None:
            status, headers = problem
            message = "admin token required" if status == 401 else "too many wrong admin tokens; try later"
            kind = "AuthenticationError" if status == 401 else "RateLimitError"
            raise HttpError(message, status_code=status, error_type=kind, code=status, headers=headers)

    _handle_errors(app, engine)

    def _respond(result: dict[str, Any] | Any) -> Response:
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> Response:
        return _respond(await serving.chat(req))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        return _respond(await serving.completions(req))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": engine.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "flywheel",
            "root": engine.model_name,
            "parent": None,
            "max_model_len": engine.max_model_len,
        }
        adapters = [
            {**card, "id": name, "root": name, "parent": engine.model_name, "version": version}
            for name, version in engine.adapters.items()
        ]
        return {"object": "list", "data": [card, *adapters]}

    @app.post("/pause", dependencies=[Depends(admin)])
    async def pause(mode: str = Query("abort")) -> dict[str, Any]:
        if mode not in ("abort", "wait", "keep"):
            raise InvalidRequestError(f"mode must be abort, wait or keep, got {mode!r}")
        await engine.pause(mode)  # type: ignore[arg-type]
        return {"status": "paused", "mode": mode}

    @app.post("/resume", dependencies=[Depends(admin)])
    async def resume() -> dict[str, Any]:
        await engine.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, Any]:
        return {"is_paused": engine.is_paused}

    @app.post("/load_weights", dependencies=[Depends(admin)])
    async def load_weights(req: LoadWeightsRequest) -> dict[str, Any]:
        await engine.load_weights(req.path, req.version)
        return {"status": "ok", "weight_version": engine.weight_version}

    @app.post("/load_adapter", dependencies=[Depends(admin)])
    async def load_adapter(req: LoadAdapterRequest) -> dict[str, Any]:
        adapter = await engine.load_adapter(req.name, req.path, req.version)
        return {"status": "ok", "adapter": adapter.name, "version": adapter.version, "bytes": adapter.nbytes}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version_() -> dict[str, Any]:
        return {"version": _package_version(), "weight_version": engine.weight_version}

    return app


def _handle_errors(app: FastAPI, engine: InferenceEngine) -> None:
    """One handler per error: each becomes an OpenAI-format error body."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":
            detail = errors[0].get("ctx", {}).get("error", errors[0].get("msg"))
            return _error(400, f"request body is not valid JSON: {detail}", "BadRequestError")
        message, param = validation_message(errors)
        return _error(400, message, "BadRequestError", param)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return _error(400, str(exc), "BadRequestError")

    @app.exception_handler(WeightLoadError)
    async def _weights(_: Request, exc: WeightLoadError) -> JSONResponse:
        message = f"{exc}; still serving weight version {engine.weight_version}"
        return _error(400, message, "WeightLoadError")

    @app.exception_handler(HttpError)
    async def _http(_: Request, exc: HttpError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineStepError)
    async def _engine(_: Request, exc: EngineStepError) -> JSONResponse:
        return _error(500, str(exc), "InternalServerError")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "InternalServerError")
