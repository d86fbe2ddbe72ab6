"""Signing in to the web view with the admin token.

A request is signed in when it carries the admin token (``Authorization: Bearer`` or ``X-Admin-Token``,
as every admin API takes it) or the session cookie that the sign-in form sets. The cookie holds an
HMAC-SHA256 of a fixed label under the token, not the token: it is valid exactly as long as the token
is, and a new token signs everyone out. It is ``HttpOnly``, ``SameSite=Strict`` and scoped to the view's
path; set ``Secure`` by serving the view behind TLS (``FLYWHEEL_ENV=production`` marks it Secure).
"""

from __future__ import annotations

import hashlib
import hmac
import os
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


async def sign_in(request: Request, admin_token: str, prefix: str) -> Response:
    body = await request.body()
    if len(body) > MAX_FORM:
        return login_page(prefix, "the form is too large", status=413)
    form = parse_qs(body.decode("utf-8", "replace"))
    given = (form.get("token") or [""])[0].strip()
    if not token_matches(given, admin_token):
        return login_page(prefix, "that is not this server's admin token")
    answer = RedirectResponse(prefix + "/", status_code=303)
    answer.set_cookie(
        COOKIE,
        session_value(admin_token),
        path=prefix,
        httponly=True,
        samesite="strict",
        secure=os.environ.get("FLYWHEEL_ENV") == "production",
    )
    return answer


def sign_out(prefix: str) -> Response:
    answer = RedirectResponse(prefix + "/login", status_code=303)
    answer.delete_cookie(COOKIE, path=prefix)
    return answer
