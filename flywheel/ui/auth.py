"""Signing in to the web view with the admin token.

A request is signed in when it carries the admin token (``Authorization: Bearer`` or ``X-Admin-Token``,
as every admin API takes it) or the cookie of a live session. The sign-in form opens a session
(:class:`SessionStore`): a random id (``secrets.token_urlsafe(32)``) kept in memory by the server, which
ends after ``FLYWHEEL_UI_SESSION_IDLE_S`` without a request or ``FLYWHEEL_UI_SESSION_MAX_S`` after sign-in,
at sign-out (the server forgets it: the old cookie, replayed, signs nothing in), and when the admin token
changes (each session keeps a keyed fingerprint of the token it was opened with). At most
``max_sessions`` are kept, the oldest dropped first. A restart ends every session.

The cookie is ``HttpOnly``, ``SameSite=Strict``, scoped to the view's path, and ``Secure`` over TLS, on a
server bound beyond loopback, and in production (:func:`secure_cookie`). The sign-in form's body is read
at most ``MAX_FORM`` bytes far, and failed sign-ins are throttled per client address
(:class:`SignInThrottle`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from flywheel.ui.html import login_page
from infra.http import bearer_token, token_matches
from infra.settings import is_loopback
from infra.throttle import FailureThrottle

COOKIE = "flywheel_ui"
MAX_FORM = 4096


@dataclass
class _Session:
    token_print: bytes  # HMAC of the admin token under the store's own key
    opened: float
    seen: float


class SessionStore:
    """The web view's sessions, in memory: id → (token fingerprint, opened, last seen), at most
    ``max_sessions`` (the oldest opened dropped first). Times from ``clock`` (monotonic seconds)."""

    def __init__(
        self,
        *,
        idle_s: float = 30 * 60.0,
        max_s: float = 12 * 3600.0,
        max_sessions: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def _print(self, admin_token: str) -> bytes:
        return hmac.new(self._key, admin_token.encode(), hashlib.sha256).digest()

    def _live(self, session: _Session, now: float) -> bool:
        return now - session.seen <= self.idle_s and now - session.opened <= self.max_s

    def open(self, admin_token: str) -> str:
        """A new session for a sign-in with ``admin_token``; its id is the cookie's value."""
        now = self._clock()
        for sid in [sid for sid, s in self._sessions.items() if not self._live(s, now)]:
            del self._sessions[sid]
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = _Session(self._print(admin_token), now, now)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return sid

    def check(self, sid: str, admin_token: str) -> bool:
        """Whether ``sid`` is a live session opened with ``admin_token`` (and it is now seen); a session
        that has expired or was opened with another token is forgotten."""
        session = self._sessions.get(sid) if sid else None
        if session is None:
            return False
        now = self._clock()
        if not self._live(session, now) or not hmac.compare_digest(
            session.token_print, self._print(admin_token)
        ):
            del self._sessions[sid]
            return False
        session.seen = now
        return True

    def revoke(self, sid: str) -> None:
        self._sessions.pop(sid, None)


def signed_in(request: Request, admin_token: str, sessions: SessionStore) -> bool:
    if not admin_token:
        return False
    if token_matches(bearer_token(request.headers, "x-admin-token"), admin_token):
        return True
    return sessions.check(request.cookies.get(COOKIE, ""), admin_token)


class SignInThrottle(FailureThrottle):
    """At most ``limit`` failed sign-ins per client address in ``window_s``; past that, 429 until the
    window has passed (``infra/throttle.py``: bounded memory whatever a client sends)."""


async def read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is over ``limit`` bytes (nothing more of it is read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def sign_in(
    request: Request,
    admin_token: str,
    prefix: str,
    throttle: SignInThrottle,
    sessions: SessionStore,
    *,
    bound_host: str = "127.0.0.1",
) -> Response:
    client = request.client.host if request.client else "?"
    wait = throttle.retry_after(client)
    if wait is not None:
        refused = login_page(
            prefix, "too many failed sign-ins from this address; try again later", status=429
        )
        refused.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return refused
    body = await read_bounded(request, MAX_FORM)
    if body is None:
        return login_page(prefix, "the form is too large", status=413)
    form = parse_qs(body.decode("utf-8", "replace"))
    given = (form.get("token") or [""])[0].strip()
    if not token_matches(given, admin_token):
        throttle.failed(client)
        return login_page(prefix, "that is not this server's admin token")
    answer = RedirectResponse(prefix + "/", status_code=303)
    answer.set_cookie(
        COOKIE,
        sessions.open(admin_token),
        max_age=max(1, math.ceil(sessions.max_s)),
        path=prefix,
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request.url.scheme, bound_host),
    )
    return answer


def secure_cookie(scheme: str, bound_host: str) -> bool:
    """``Secure`` when the view is served over TLS, on a server bound beyond loopback (``0.0.0.0``, a LAN
    address: a TLS proxy in front is then the only sane way to reach it), and always in production."""
    return scheme == "https" or not is_loopback(bound_host) or os.environ.get("FLYWHEEL_ENV") == "production"


def sign_out(request: Request, prefix: str, sessions: SessionStore) -> Response:
    """Ends the request's session on the server (its cookie signs nothing in afterwards) and in the browser."""
    sessions.revoke(request.cookies.get(COOKIE, ""))
    answer = RedirectResponse(prefix + "/login", status_code=303)
    answer.delete_cookie(COOKIE, path=prefix, httponly=True, samesite="strict")
    return answer
