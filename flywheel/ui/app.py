"""The web view's routes: ``create_ui_router`` (mounted by ``flywheel up`` on the gateway's port) and
``create_ui_app`` (``flywheel ui``: the same routes alone).

    GET  /ui/                         the episode list (filters and ``page`` in the query string)
    GET  /ui/episodes/rows            its rows alone (what the list polls)
    GET  /ui/episodes/{id}            one episode
    GET  /ui/training                 charts over trainer steps, weight versions, time, tenants
    GET  /ui/api/training             their data (JSON; what the page polls)
    GET  /ui/versions                 the release events (candidates, gates, promotions, rollbacks, pins)
    GET  /ui/api/episodes/{id}/last   when an episode last changed (JSON; what its page polls)
    GET  /ui/static/{file}            Chart.js, the script and the styles (no sign-in needed)
    GET|POST /ui/login, GET /ui/logout

Sign-in (:mod:`flywheel.ui.auth`): the admin token as a bearer token or ``X-Admin-Token``, or
once in the sign-in form, which opens a server-side session (idle and absolute expiry, revoked at
sign-out and when the token changes) and sets its cookie. ``create_ui_app`` checks ``Host`` and, on
``POST``, ``Origin`` for every route (:mod:`infra.origin`: 421 / 403); mounted on the gateway, the
gateway's own :class:`infra.origin.OriginGuard` covers ``/ui``. Reads run on the event log API's reader threads
(``infra.eventlog.api.Readers``: bounded, each with a deadline), never on the event loop. A bad filter,
an unknown episode or path answers an HTML page with its 4xx; a busy or slow event log a 503 / 504.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from flywheel.ui import auth
from flywheel.ui.episode import build_episode
from flywheel.ui.episode_page import episode_page
from flywheel.ui.html import error_page, login_page
from flywheel.ui.list_page import list_page, rows_html
from flywheel.ui.params import BadInput, parse_list_query
from flywheel.ui.training_page import training_data, training_page
from flywheel.ui.versions_page import parse_release_query, read_release_events, versions_page
from infra.body import BodyBound
from infra.eventlog.api import Readers
from infra.eventlog.errors import EventLogError, EventLogTimeoutError
from infra.eventlog.models import Bucket, EpisodeFilter, EpisodeSummary
from infra.eventlog.reader import TrendReader
from infra.http import HttpError, error_response
from infra.origin import HostPolicy, OriginGuard

PREFIX = "/ui"
STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 1024  # the view takes forms, never data
STATIC_FILES = {"chart.umd.min.js": "text/javascript", "ui.js": "text/javascript", "ui.css": "text/css"}
_EPISODE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
BUCKETS: tuple[Bucket, ...] = ("minute", "hour", "day")


def _status_of(exc: Exception) -> tuple[int, str] | None:
    match exc:
        case BadInput():
            return 400, str(exc)
        case HttpError():
            return exc.status_code, exc.message
        case EventLogTimeoutError():
            return 504, str(exc)
        case EventLogError():
            return 503, f"the event log cannot answer: {exc}"
    return None


def _last(summary: EpisodeSummary | None) -> str:
    if summary is None:
        return ""
    return f"{summary.last_event_at.isoformat()}/{summary.num_calls}/{summary.status}/{summary.scored}"


def _bucket_of(request: Request) -> Bucket:
    raw = request.query_params.get("bucket", "minute")
    for b in BUCKETS:
        if raw == b:
            return b
    raise BadInput(f"bucket must be one of {', '.join(BUCKETS)}, not {raw!r}", "bucket")


def _episode_id_of(raw: str) -> str:
    if not _EPISODE_ID.match(raw):
        raise BadInput(f"not an episode id: {raw[:80]!r}", "episode_id")
    return raw


TokenSource = str | Callable[[], str]


@dataclass
class SignIn:
    """How the view signs people in: its sessions (``FLYWHEEL_UI_SESSION_IDLE_S`` / ``_MAX_S``) and the
    host it is served on (beyond loopback the cookie is ``Secure``)."""

    sessions: auth.SessionStore = field(default_factory=auth.SessionStore)
    bound_host: str = "127.0.0.1"


class _View:
    """What every route of the view shares: the reader and its threads, the sign-in, the error answers.
    ``admin_token`` may be a function, read at every request: a new token signs everyone out."""

    def __init__(self, reader: TrendReader, admin_token: TokenSource, prefix: str, sign_in: SignIn) -> None:
        self.reader = reader
        self._token = admin_token
        self.prefix = prefix
        self.sign_in = sign_in
        self.readers = Readers()

    @property
    def admin_token(self) -> str:
        return self._token if isinstance(self._token, str) else self._token()

    def signed_in(self, request: Request) -> bool:
        return auth.signed_in(request, self.admin_token, self.sign_in.sessions)

    async def html(self, request: Request, render: Callable[[], Awaitable[str]]) -> Response:
        if not self.signed_in(request):
            return login_page(self.prefix)
        try:
            return HTMLResponse(await render())
        except Exception as exc:
            answer = _status_of(exc)
            if answer is None:
                raise
            return error_page(self.prefix, *answer)

    async def api(self, request: Request, build: Callable[[], Awaitable[object]]) -> Response:
        if not self.signed_in(request):
            return error_response(401, "sign in first", "authentication_error", code="invalid_admin_token")
        try:
            return JSONResponse(await build())
        except Exception as exc:
            answer = _status_of(exc)
            if answer is None:
                raise
            kind = "invalid_request_error" if answer[0] < 500 else "server_error"
            return error_response(answer[0], answer[1], kind)

    async def summary(self, episode_id: str) -> EpisodeSummary | None:
        found = await self.readers.run(
            lambda: self.reader.episodes(EpisodeFilter(episode_ids=[episode_id], limit=1))
        )
        return found[0] if found else None


def _episode_routes(router: APIRouter, view: _View) -> None:
    """The episode list, its rows, one episode and when it last changed."""
    prefix, reader, readers = view.prefix, view.reader, view.readers

    @router.get(prefix, include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(prefix + "/", status_code=307)

    @router.get(prefix + "/")
    async def episodes(request: Request) -> Response:
        async def render() -> str:
            q = parse_list_query(request.query_params)
            return list_page(prefix, q, await readers.run(lambda: reader.episodes(q.filter)))

        return await view.html(request, render)

    @router.get(prefix + "/episodes/rows")
    async def episode_rows(request: Request) -> Response:
        async def render() -> str:
            q = parse_list_query(request.query_params)
            found = await readers.run(lambda: reader.episodes(q.filter))
            return rows_html(prefix, found[: q.page_size])

        return await view.html(request, render)

    @router.get(prefix + "/episodes/{episode_id}")
    async def episode(request: Request, episode_id: str) -> Response:
        async def render() -> str:
            eid = _episode_id_of(episode_id)
            events = await readers.run(lambda: reader.episode_events(eid))
            if not events:
                raise HttpError(f"no episode {eid} in the event log", status_code=404)
            return episode_page(prefix, build_episode(eid, events), _last(await view.summary(eid)))

        return await view.html(request, render)

    @router.get(prefix + "/api/episodes/{episode_id}/last")
    async def episode_last(request: Request, episode_id: str) -> Response:
        async def build() -> object:
            return {"last": _last(await view.summary(_episode_id_of(episode_id)))}

        return await view.api(request, build)


def _training_routes(router: APIRouter, view: _View) -> None:
    """The training page and the data it polls."""
    prefix, reader, readers = view.prefix, view.reader, view.readers

    @router.get(prefix + "/training")
    async def training(request: Request) -> Response:
        async def render() -> str:
            bucket = _bucket_of(request)
            steps = await readers.run(lambda: reader.trainer_steps())
            tenants = await readers.run(lambda: reader.tenant_feedback())
            return training_page(prefix, steps, tenants, bucket)

        return await view.html(request, render)

    @router.get(prefix + "/api/training")
    async def training_api(request: Request) -> Response:
        async def build() -> object:
            bucket = _bucket_of(request)
            steps = await readers.run(lambda: reader.trainer_steps())
            versions = await readers.run(lambda: reader.by_version())
            stats = await readers.run(lambda: reader.stats(bucket=bucket))
            tenants = await readers.run(lambda: reader.tenant_feedback())
            return training_data(steps, versions, stats, tenants)

        return await view.api(request, build)


def _versions_routes(router: APIRouter, view: _View) -> None:
    """The release events: what was proposed, how it was judged, what serves."""
    prefix, reader, readers = view.prefix, view.reader, view.readers

    @router.get(prefix + "/versions")
    async def versions(request: Request) -> Response:
        async def render() -> str:
            q = parse_release_query(request.query_params)
            return versions_page(prefix, q, await readers.run(lambda: read_release_events(reader, q)))

        return await view.html(request, render)


def _site_routes(router: APIRouter, view: _View) -> None:
    """The static files, sign-in and sign-out, and a 404 page for any other path (so: added last)."""
    prefix, sessions = view.prefix, view.sign_in.sessions
    throttle = auth.SignInThrottle()

    @router.get(prefix + "/static/{name}")
    async def static(name: str) -> Response:
        if name not in STATIC_FILES:
            return error_page(prefix, 404, f"no file {name[:80]!r}")
        return FileResponse(STATIC / name, media_type=STATIC_FILES[name])

    @router.get(prefix + "/login")
    async def login_form() -> Response:
        return login_page(prefix, status=200)

    @router.post(prefix + "/login")
    async def login(request: Request) -> Response:
        return await auth.sign_in(
            request, view.admin_token, prefix, throttle, sessions, bound_host=view.sign_in.bound_host
        )

    @router.get(prefix + "/logout")
    async def logout(request: Request) -> Response:
        return auth.sign_out(request, prefix, sessions)

    @router.get(prefix + "/{rest:path}")
    async def unknown(rest: str) -> Response:
        return error_page(prefix, 404, f"no page {prefix}/{rest[:80]}")


# every answer of the view: scripts only from its own static files (no inline script runs, so injected
# markup cannot run one), no framing, no sniffing, no referrer; pages full of prompts are never cached
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class _SecureRoute(APIRoute):
    """A route whose every answer carries :data:`SECURITY_HEADERS` (and ``no-store`` but for static files)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        static = "/static/" in self.path

        async def secured(request: Request) -> Response:
            response = await handler(request)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            if not static:
                response.headers["Cache-Control"] = "no-store"
            return response

        return secured


def create_ui_router(
    reader: TrendReader, admin_token: TokenSource, *, prefix: str = PREFIX, sign_in: SignIn | None = None
) -> APIRouter:
    """The view's routes under ``prefix``, reading ``reader``, signed in with ``admin_token``."""
    router = APIRouter(tags=["ui"], include_in_schema=False, route_class=_SecureRoute)
    view = _View(reader, admin_token, prefix, sign_in or SignIn())
    _episode_routes(router, view)
    _training_routes(router, view)
    _versions_routes(router, view)
    _site_routes(router, view)
    return router


def create_ui_app(
    reader: TrendReader, admin_token: TokenSource, *, sign_in: SignIn | None = None, allowed_hosts: str = ""
) -> FastAPI:
    """The view alone (``flywheel ui``): its routes, and ``/`` sends the browser to them; every route
    behind the Host/Origin checks of a server on ``sign_in.bound_host`` (``FLYWHEEL_ALLOWED_HOSTS``:
    ``allowed_hosts``)."""
    sign_in = sign_in or SignIn()
    app = FastAPI(title="Flywheel", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(create_ui_router(reader, admin_token, sign_in=sign_in))
    app.add_middleware(BodyBound, max_bytes=MAX_BODY_BYTES)  # forms only: sign-in, sign-out, versions
    app.add_middleware(OriginGuard, policy=HostPolicy.for_server(sign_in.bound_host, allowed_hosts))

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse(PREFIX + "/", status_code=307)

    return app
