"""Issue #52: web view sign-ins are server-side sessions, and the view answers only for its own names.

Each test serves ``create_ui_app`` with uvicorn on a loopback port and talks to it over HTTP. A session
is a random id the server keeps (``flywheel.ui.auth.SessionStore``): it ends when idle too long, at its
absolute limit, at sign-out (the replayed cookie is refused) and when the admin token changes. The
cookie is ``HttpOnly``, ``SameSite=Strict``, path-scoped, and ``Secure`` beyond loopback. A rebinding
``Host`` gets 421, a cross-origin ``POST`` 403 (``infra.origin``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
import pytest

from flywheel.ui.app import SignIn, TokenSource, create_ui_app
from flywheel.ui.auth import COOKIE, SessionStore, secure_cookie
from infra.eventlog.reader import TrendReader
from infra.service import HttpServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "ui-sessions-admin-token-0123456789"
PROBE = "/ui/api/episodes/ep-1/last"  # a signed-in JSON route: 200, else 401


class _EmptyLog:
    """The one read the probe route makes, on an empty event log."""

    def episodes(self, *_: Any, **__: Any) -> list[Any]:
        return []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def serving(
    token: TokenSource = TOKEN, sessions: SessionStore | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[httpx.AsyncClient, SessionStore]]:
    store = SessionStore() if sessions is None else sessions
    app = create_ui_app(cast(TrendReader, _EmptyLog()), token, sign_in=SignIn(store, bound_host=host))
    server = HttpServer(app, host=host, port=0)
    url = await server.start()
    url = url.replace("0.0.0.0", "127.0.0.1")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, store
    finally:
        await server.stop()


async def sign_in(client: httpx.AsyncClient, token: str = TOKEN) -> str:
    r = await client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text[:200]
    client.cookies.clear()  # each request below names its cookie itself
    return str(r.cookies[COOKIE])


async def probe(client: httpx.AsyncClient, sid: str) -> int:
    return (await client.get(PROBE, headers={"Cookie": f"{COOKIE}={sid}"})).status_code


async def test_each_sign_in_opens_its_own_random_session() -> None:
    async with serving() as (client, store):
        first, second = await sign_in(client), await sign_in(client)
        assert first != second and len(first) >= 43 and TOKEN not in first
        assert len(store) == 2
        assert await probe(client, first) == 200 and await probe(client, second) == 200
        assert await probe(client, "made-up-" + first[8:]) == 401
        assert await probe(client, "") == 401


async def test_an_idle_session_expires() -> None:
    clock = Clock()
    async with serving(sessions=SessionStore(idle_s=60, max_s=3600, clock=clock)) as (client, store):
        sid = await sign_in(client)
        clock.now += 59
        assert await probe(client, sid) == 200  # a request within the idle limit keeps it alive
        clock.now += 59
        assert await probe(client, sid) == 200
        clock.now += 61
        assert await probe(client, sid) == 401
        assert len(store) == 0  # forgotten, not merely refused
        clock.now -= 61  # even were the clock to say otherwise now
        assert await probe(client, sid) == 401


async def test_a_busy_session_still_ends_at_its_absolute_limit() -> None:
    clock = Clock()
    async with serving(sessions=SessionStore(idle_s=60, max_s=300, clock=clock)) as (client, _):
        sid = await sign_in(client)
        for _ in range(5):
            clock.now += 50
            assert await probe(client, sid) == 200
        clock.now += 51  # 301 s after sign-in, 51 s after the last request
        assert await probe(client, sid) == 401


async def test_sign_out_revokes_the_session_on_the_server() -> None:
    async with serving() as (client, store):
        sid, other = await sign_in(client), await sign_in(client)
        out = await client.get("/ui/logout", headers={"Cookie": f"{COOKIE}={sid}"}, follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert f'{COOKIE}=""' in out.headers["set-cookie"] or "max-age=0" in out.headers["set-cookie"].lower()
        assert await probe(client, sid) == 401  # the old cookie, replayed, signs nothing in
        assert (await client.get("/ui/", headers={"Cookie": f"{COOKIE}={sid}"})).status_code == 401
        assert await probe(client, other) == 200  # another sign-in is not touched
        assert len(store) == 1


async def test_a_new_admin_token_signs_everyone_out() -> None:
    current = [TOKEN]
    async with serving(token=lambda: current[0]) as (client, store):
        sessions = [await sign_in(client) for _ in range(3)]
        assert [await probe(client, s) for s in sessions] == [200, 200, 200]
        current[0] = "another-admin-token-abcdefghijklmnop"
        assert [await probe(client, s) for s in sessions] == [401, 401, 401]
        assert len(store) == 0
        r = await client.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        assert r.status_code == 401  # the old token no longer signs in either
        fresh = await sign_in(client, current[0])
        assert await probe(client, fresh) == 200
        current[0] = TOKEN  # back to the old token: the sessions it had are gone for good
        assert [await probe(client, s) for s in sessions] == [401, 401, 401]
        assert await probe(client, fresh) == 401


async def test_the_store_keeps_at_most_max_sessions_dropping_the_oldest() -> None:
    async with serving(sessions=SessionStore(max_sessions=3)) as (client, store):
        ids = [await sign_in(client) for _ in range(5)]
        assert len(store) == 3
        assert [await probe(client, s) for s in ids] == [401, 401, 200, 200, 200]


async def test_the_bearer_token_still_signs_in_without_a_session() -> None:
    async with serving() as (client, store):
        for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"X-Admin-Token": TOKEN}):
            assert (await client.get(PROBE, headers=headers)).status_code == 200
        assert (await client.get(PROBE, headers={"Authorization": "Bearer nope"})).status_code == 401
        assert len(store) == 0


async def test_the_cookie_is_httponly_strict_and_path_scoped_and_not_secure_on_loopback() -> None:
    async with serving() as (client, _):
        r = await client.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie, cookie
        assert "max-age=43200" in cookie, cookie  # the absolute limit, in the browser too
        assert "secure" not in cookie.replace("samesite", ""), cookie


async def test_the_cookie_is_secure_on_a_server_bound_beyond_loopback() -> None:
    async with serving(host="0.0.0.0") as (client, _):
        r = await client.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower(), r.headers["set-cookie"]


@pytest.mark.parametrize(
    ("scheme", "host", "production", "secure"),
    [
        ("http", "127.0.0.1", False, False),
        ("http", "localhost", False, False),
        ("http", "::1", False, False),
        ("https", "127.0.0.1", False, True),
        ("http", "0.0.0.0", False, True),
        ("http", "10.1.2.3", False, True),
        ("http", "127.0.0.1", True, True),
    ],
)
def test_when_the_cookie_is_secure(
    scheme: str, host: str, production: bool, secure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_ENV", "production" if production else "development")
    assert secure_cookie(scheme, host) is secure


async def test_a_rebinding_host_and_a_cross_origin_post_are_refused() -> None:
    async with serving() as (client, _):
        port = int(client.base_url.port or 0)
        for path in ("/ui/", "/ui/login", "/ui/static/ui.css", "/"):
            r = await client.get(path, headers={"Host": f"evil.example:{port}"})
            assert r.status_code == 421, (path, r.status_code)
            assert r.json()["error"]["code"] == "host_not_allowed"
        r = await client.post("/ui/login", data={"token": TOKEN}, headers={"Host": "evil.example"})
        assert r.status_code == 421
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert (await client.get("/ui/login", headers={"Host": host})).status_code == 200, host
        # a cross-site form: refused before the token is even looked at
        for origin in ("http://evil.example", f"http://localhost:{port + 1}", "null"):
            r = await client.post(
                "/ui/login", data={"token": TOKEN}, headers={"Origin": origin}, follow_redirects=False
            )
            assert r.status_code == 403, origin
            assert r.json()["error"] == {
                "message": "cross-origin request refused",
                "type": "permission_error",
                "param": None,
                "code": "cross_origin_request",
            }
        same = await client.post(
            "/ui/login",
            data={"token": TOKEN},
            headers={"Origin": f"http://127.0.0.1:{port}"},
            follow_redirects=False,
        )
        assert same.status_code == 303  # the view's own form
        # what Chromium sends for the view's own form (its answers say Referrer-Policy: no-referrer)
        own = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        r = await client.post("/ui/login", data={"token": TOKEN}, headers=own, follow_redirects=False)
        assert r.status_code == 303
        for site in ("cross-site", "same-site"):  # a page elsewhere, or on another port of this host
            r = await client.post("/ui/login", data={"token": TOKEN}, headers={"Sec-Fetch-Site": site})
            assert r.status_code == 403, site
            assert r.json()["error"]["code"] == "cross_origin_request"
