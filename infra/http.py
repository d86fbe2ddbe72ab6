"""The HTTP kit every service's API uses: bearer checks, OpenAI-format error bodies, the handlers.

One error shape for every API Flywheel serves (the gateway, the event-log API, the ops API, the
engine)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": "..."}}

* :class:`HttpError` carries a status, a type, a code and a param; :func:`install_error_handlers`
  answers it, FastAPI's validation errors (400 for a body that is not JSON, else 422, ``param`` the
  field's path), Starlette's own HTTP errors (404 for an unknown path, 405, ...) and anything
  unexpected (a 500 that names no internals; the exception is logged) in that shape. A router mounted
  into an app whose handlers are someone else's uses :class:`HttpErrorRoute` instead, which answers
  :class:`HttpError` itself.
* :func:`bearer_token` and :func:`token_matches`: ``Authorization: Bearer <token>`` read one way, and
  compared in constant time; an empty expected token matches nothing. :func:`require_admin_token` is
  the one admin check (``FLYWHEEL_ADMIN_TOKEN`` as a bearer token or in ``X-Admin-Token``), a 401
  ``invalid_admin_token`` otherwise, and with an :class:`infra.throttle.FailureThrottle` a 429 for an
  address that sent wrong tokens too often.

The engine keeps vLLM's flavour of the same shape (``type`` such as ``BadRequestError``, ``code`` the
status) so clients written against vLLM read it unchanged; it builds its bodies with
:func:`error_response` too.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.throttle import FailureThrottle

log = structlog.get_logger("flywheel.http")

Code = str | int | None


def error_body(
    message: str, error_type: str, *, code: Code = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    error_type: str,
    *,
    code: Code = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(message, error_type, code=code, param=param),
        status_code=status,
        headers=dict(headers or {}),
    )


class HttpError(Exception):
    """An error with its answer: ``status_code``, ``error_type``, ``code`` and ``param``."""

    status_code: int = 500
    error_type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        code: Code = None,
        param: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, code=self.code, param=self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def bearer_token(headers: Mapping[str, str], fallback: str | None = None) -> str:
    """The token of ``Authorization: Bearer <token>`` (the scheme in any case), else the value of the
    ``fallback`` header when one is named; ``""`` without either."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get(fallback, "").strip() if fallback else ""


def token_matches(given: str, expected: str) -> bool:
    """``given == expected`` in constant time; an empty ``expected`` (no token configured) matches nothing."""
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def admin_token_problem(
    given: str, expected: str, *, throttle: FailureThrottle | None = None, client: str | None = None
) -> tuple[int, dict[str, str]] | None:
    """None when ``given`` is the admin token; else the status to answer and its headers: 429 with
    ``Retry-After`` for a ``client`` the ``throttle`` holds back (before its token is looked at, so the
    throttle answers no guesses), 401 otherwise. A wrong token counts against ``client``; none at all
    does not (it guesses nothing)."""
    if throttle is not None and client is not None:
        wait = throttle.retry_after(client)
        if wait is not None:
            return 429, {"Retry-After": str(max(1, math.ceil(wait)))}
    if token_matches(given, expected):
        return None
    if throttle is not None and client is not None and given:
        throttle.failed(client)
    return 401, {}


def require_admin_token(
    headers: Mapping[str, str],
    expected: str,
    *,
    throttle: FailureThrottle | None = None,
    client: str | None = None,
) -> None:
    """Every admin API's check: the admin token as a bearer token or in ``X-Admin-Token``; with a
    ``throttle``, 429 ``too_many_failed_tokens`` for an address that sent wrong ones too often
    (:func:`admin_token_problem`)."""
    problem = admin_token_problem(
        bearer_token(headers, "x-admin-token"), expected, throttle=throttle, client=client
    )
    if problem is None:
        return
    status, extra = problem
    if status == 429:
        raise HttpError(
            "too many requests with a wrong admin token from this address; try again later",
            status_code=429,
            error_type="rate_limit_error",
            code="too_many_failed_tokens",
            headers=extra,
        )
    raise HttpError(
        "admin token required (Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>)",
        status_code=401,
        error_type="authentication_error",
        code="invalid_admin_token",
    )


ADMIN_FAILURES_PER_MINUTE = 20


def admin_throttle(request: Request) -> FailureThrottle:
    """The app's one throttle of wrong admin tokens (made on first use; every admin router of the app
    shares it)."""
    state = request.app.state
    throttle: FailureThrottle | None = getattr(state, "admin_throttle", None)
    if throttle is None:
        throttle = state.admin_throttle = FailureThrottle(limit=ADMIN_FAILURES_PER_MINUTE)
    return throttle


def require_admin(request: Request, expected: str) -> None:
    """:func:`require_admin_token` for a request, throttled per client address (:func:`admin_throttle`)."""
    client = request.client.host if request.client else None
    require_admin_token(request.headers, expected, throttle=admin_throttle(request), client=client)


def validation_message(errors: Sequence[Any], *, skip: tuple[str, ...] = ("body",)) -> tuple[str, str | None]:
    """pydantic's first error as ``("field.path: message", "field.path")``; the path leaves out ``skip``."""
    first: Mapping[str, Any] = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in skip)
    message = str(first.get("msg", "invalid request"))
    return (f"{where}: {message}" if where else message), where or None


class HttpErrorRoute(APIRoute):
    """A route that answers :class:`HttpError` (its dependencies' included) without the host app's
    handlers. A subclass maps its own exceptions to ``HttpError`` in :meth:`translate`."""

    def translate(self, exc: Exception) -> HttpError | None:
        """The answer for ``exc``, or None to let it propagate; ``HttpError`` is answered as it is."""
        return exc if isinstance(exc, HttpError) else None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = self.translate(exc)
                if answer is None:
                    raise
                return answer.response()

        return route


def install_error_handlers(app: FastAPI, *, unexpected: str = "internal error") -> None:
    """Answer :class:`HttpError`, validation errors, Starlette's HTTP errors and anything unexpected
    in OpenAI's error shape (``unexpected`` is the 500's message; the exception itself is logged)."""

    @app.exception_handler(HttpError)
    async def _http_error(_: Request, exc: HttpError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message, param = validation_message(errors)
        status = 400 if errors and errors[0].get("type") == "json_invalid" else 422
        return error_response(status, message, "invalid_request_error", code="invalid_value", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", error_type=type(exc).__name__, error=str(exc)[:500])
        return error_response(500, unexpected, "server_error")
