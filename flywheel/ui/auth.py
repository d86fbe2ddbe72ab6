"""Signing in to the web view with the admin token.

A request is signed in when it carries the admin token (``Authorization: Bearer`` or ``X-Admin-Token``,
as every admin API takes it) or the session cookie that the sign-in form sets. The cookie holds an
HMAC-SHA256 of a fixed label under the token, not the token: it is valid exactly as long as the token
is, and a new token signs everyone out. It is ``HttpOnly``, ``SameSite=Strict`` and scoped to the view's
path, and ``Secure`` over TLS and in production. The sign-in form's body is read at
most ``MAX_FORM`` bytes far, and failed sign-ins are throttled per client address (:class:`SignInThrottle`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from collections import OrderedDict, deque
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from flywheel.ui.html import login_page
from infra.http import bearer_token, token_matches

COOKIE = "flywheel_ui"
MAX_FORM = 4096


def session_value(admin_token: str) -> str:
    return hmac.new(admin_token.encode(), b"flywheel-ui-session-v1", hashlib.sha256).hexdigest()


def signed_in(request: Request, admin_token: str) -> bool:
    if not admin_token:
        return False
    if token_matches(bearer_token(request.headers, "x-admin-token"), admin_token):
        return True
    return token_matches(request.cookies.get(COOKIE, ""), session_value(admin_token))


class SignInThrottle:
    """At most ``limit`` failed sign-ins per client address in ``window_s``; past that, 429 until the
    window has passed (guessing the token costs a minute per ``limit`` tries). Remembers at most
    ``max_clients`` addresses (the oldest forgotten first), so it holds a bounded amount of memory."""

    def __init__(self, limit: int = 10, window_s: float = 60.0, max_clients: int = 10_000) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str, now: float | None = None) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        failures = self._failures.get(client)
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        if failures is None or len(failures) < self.limit:
            return None
        return self.window_s - (now - failures[0])

    def failed(self, client: str, now: float | None = None) -> None:
        self._failures.setdefault(client, deque()).append(time.monotonic() if now is None else now)
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)


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


async def sign_in(request: Request, admin_token: str, prefix: str, throttle: SignInThrottle) -> Response:
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
        session_value(admin_token),
        path=prefix,
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request),
    )
    return answer


def secure_cookie(request: Request) -> bool:
    """``Secure`` when the view is served over TLS, and always in production."""
    return request.url.scheme == "https" or os.environ.get("FLYWHEEL_ENV") == "production"


def sign_out(prefix: str) -> Response:
    answer = RedirectResponse(prefix + "/login", status_code=303)
    answer.delete_cookie(COOKIE, path=prefix)
    return answer
