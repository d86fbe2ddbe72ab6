"""Issue #52: the gateway's admin routes and the web view on its port answer only for the gateway's own
names, and refuse cross-site state changes; the LLM-call routes answer under any name.

A gateway served by uvicorn on a loopback port (``BackgroundGateway``), with the web view mounted under
``/ui`` as ``flywheel up`` mounts it. A rebinding ``Host`` (``evil.example``) gets 421
``host_not_allowed`` on ``/admin/...`` and ``/ui/...``, while ``/healthz``, ``/v1/models`` and the calls
are served; a ``POST`` to an admin route with a foreign ``Origin`` gets 403 ``cross_origin_request`` and
changes nothing. ``FLYWHEEL_ALLOWED_HOSTS`` names more hosts, or ``*``; a gateway bound beyond loopback
without it answers under any name (compose and Kubernetes reach it as ``gateway:8100``). The recorder's
own admin API (``flywheel recorder``) makes the same checks and bounds its bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from flywheel.ui.app import create_ui_router
from infra.eventlog.reader import TrendReader
from infra.origin import HostPolicy, parse_allowed_hosts, split_host
from tests.fakes.gateway_harness import ADMIN, BackgroundGateway

pytestmark = pytest.mark.timeout(60)

EVIL = "evil.example"


class _EmptyLog:
    def episodes(self, *_: Any, **__: Any) -> list[Any]:
        return []


def _gateway(tmp_path: Path, **settings: Any) -> BackgroundGateway:
    return BackgroundGateway(tmp_path, episode_wait_s=0.01, **settings)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundGateway]:
    with _gateway(tmp_path_factory.mktemp("gw")) as g:
        g.h.app.include_router(create_ui_router(cast(TrendReader, _EmptyLog()), "test-admin"))
        yield g


def _refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error


def test_a_rebinding_host_is_refused_on_admin_routes_and_the_view(gw: BackgroundGateway) -> None:
    port = int(httpx.URL(gw.url).port or 0)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        for host in (f"{EVIL}:{port}", EVIL, f"127.0.0.1.{EVIL}", f"localhost.{EVIL}:{port}"):
            _refused(c.get("/admin/state", headers={**ADMIN, "Host": host}), 421, "host_not_allowed")
            _refused(c.get("/ui/", headers={"Host": host}), 421, "host_not_allowed")
            _refused(c.get("/ui/login", headers={"Host": host}), 421, "host_not_allowed")
            _refused(c.post("/admin/pause", headers={**ADMIN, "Host": host}), 421, "host_not_allowed")
        assert gw.h.gateway.state()["paused"] is False
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2"):
            assert c.get("/admin/state", headers={**ADMIN, "Host": host}).status_code == 200, host
            assert c.get("/ui/login", headers={"Host": host}).status_code == 200, host


def test_the_llm_call_routes_and_health_answer_under_any_name(gw: BackgroundGateway) -> None:
    episode = gw.open_episode()
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert c.get("/healthz", headers={"Host": EVIL}).status_code == 200
        assert c.get(f"/episodes/{episode}/v1/models", headers={"Host": "gateway"}).status_code == 200
        _, key = gw.h.keystore.create("any-name")
        models = c.get("/v1/models", headers={"Host": EVIL, "Authorization": f"Bearer {key}"})
        assert models.status_code == 200, models.text[:200]
        call = c.post(
            f"/episodes/{episode}/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Host": "gateway.flywheel.svc.cluster.local:8100", "Origin": f"http://{EVIL}"},
        )
        assert call.status_code == 200, call.text[:200]


def test_a_cross_origin_post_to_an_admin_route_changes_nothing(gw: BackgroundGateway) -> None:
    port = int(httpx.URL(gw.url).port or 0)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        for origin in (f"http://{EVIL}", f"http://127.0.0.1:{port + 1}", f"https://localhost:{port}", "null"):
            _refused(c.post("/admin/pause", headers={**ADMIN, "Origin": origin}), 403, "cross_origin_request")
            _refused(
                c.post("/ui/login", data={"token": "x"}, headers={"Origin": origin}),
                403,
                "cross_origin_request",
            )
        _refused(
            c.post("/admin/pause", headers={**ADMIN, "Sec-Fetch-Site": "cross-site"}),
            403,
            "cross_origin_request",
        )
        assert gw.h.gateway.state()["paused"] is False
        # a GET is not a state change (SameSite and the token guard reads); the same origin may post
        assert c.get("/admin/state", headers={**ADMIN, "Origin": f"http://{EVIL}"}).status_code == 200
        same = c.post("/admin/pause", headers={**ADMIN, "Origin": f"http://127.0.0.1:{port}"})
        assert same.status_code == 200, same.text[:200]
        assert c.post("/admin/resume", headers=ADMIN).status_code == 200  # no Origin: a script, an SDK
        assert gw.h.gateway.state()["paused"] is False


def test_allowed_hosts_names_more_hosts(tmp_path: Path) -> None:
    with (
        _gateway(tmp_path, allowed_hosts="flywheel.internal, Ops.Example:443") as g,
        httpx.Client(base_url=g.url, timeout=10) as c,
    ):
        for host in ("flywheel.internal", "ops.example:8100", "localhost"):
            assert c.get("/admin/state", headers={**ADMIN, "Host": host}).status_code == 200, host
        _refused(c.get("/admin/state", headers={**ADMIN, "Host": EVIL}), 421, "host_not_allowed")
        # a front end on an allowed host may post (a proxy that rewrites Host keeps Origin)
        ok = c.post("/admin/resume", headers={**ADMIN, "Origin": "https://ops.example"})
        assert ok.status_code == 200, ok.text[:200]
        _refused(
            c.post("/admin/resume", headers={**ADMIN, "Origin": f"https://{EVIL}"}),
            403,
            "cross_origin_request",
        )


def test_a_gateway_bound_beyond_loopback_answers_under_any_name_unless_told(tmp_path: Path) -> None:
    # the policy follows FLYWHEEL_GATEWAY_HOST (the server itself listens on loopback here)
    with (
        _gateway(tmp_path / "open", gateway_host="0.0.0.0") as g,
        httpx.Client(base_url=g.url, timeout=10) as c,
    ):
        assert c.get("/admin/state", headers={**ADMIN, "Host": "gateway:8100"}).status_code == 200
        _refused(
            c.post("/admin/pause", headers={**ADMIN, "Origin": f"http://{EVIL}"}), 403, "cross_origin_request"
        )
    with (
        _gateway(tmp_path / "named", gateway_host="0.0.0.0", allowed_hosts="gateway") as g,
        httpx.Client(base_url=g.url, timeout=10) as c,
    ):
        assert c.get("/admin/state", headers={**ADMIN, "Host": "gateway:8100"}).status_code == 200
        _refused(c.get("/admin/state", headers={**ADMIN, "Host": EVIL}), 421, "host_not_allowed")


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        ("Example.COM:8100", ("example.com", "8100")),
        ("example.com.", ("example.com", "")),
        ("[::1]:80", ("::1", "80")),
        ("[::1]", ("::1", "")),
        ("127.0.0.1", ("127.0.0.1", "")),
    ],
)
def test_split_host(value: str, parts: tuple[str, str]) -> None:
    assert split_host(value) == parts


def test_the_policy_of_each_bind() -> None:
    assert parse_allowed_hosts(" a.example , *, [::1]:8, ") == ("a.example", "*", "::1")
    loopback = HostPolicy.for_server("127.0.0.1")
    assert not loopback.any_host and loopback.host_allowed("localhost") and loopback.host_allowed("127.9.9.9")
    assert not loopback.host_allowed(EVIL) and not loopback.host_allowed("0.0.0.0")
    assert loopback.host_allowed("10.0.0.5", reached="10.0.0.5")  # the address the connection reached
    assert HostPolicy.for_server("0.0.0.0").any_host
    assert HostPolicy.for_server("127.0.0.1", "*").any_host
    named = HostPolicy.for_server("10.0.0.5", "flywheel.internal")
    assert not named.any_host and named.host_allowed("10.0.0.5") and named.host_allowed("flywheel.internal")
    assert named.origin_allowed("https://flywheel.internal", "10.0.0.5:8100")
    assert not HostPolicy.for_server("127.0.0.1", "*").origin_allowed(f"http://{EVIL}", "127.0.0.1:1")
    assert loopback.origin_allowed("http://localhost", "localhost:80")
    assert loopback.origin_allowed("https://localhost:443", "localhost")
    assert not loopback.origin_allowed("http://localhost:8101", "localhost:8100")
    assert not loopback.origin_allowed("http://[::1", "localhost")
    # state changes: Sec-Fetch-Site decides where a browser sent it, else Origin; neither: no browser
    same = "127.0.0.1:8100"
    assert loopback.state_change_allowed(None, None, same)
    assert loopback.state_change_allowed("null", "same-origin", same)
    assert loopback.state_change_allowed(None, "none", same)  # typed by the user
    assert not loopback.state_change_allowed("http://127.0.0.1:8100", "cross-site", same)
    assert not loopback.state_change_allowed(None, "same-site", same)
    assert not loopback.state_change_allowed("null", None, same)
    assert loopback.state_change_allowed("http://127.0.0.1:8100", None, same)
    assert named.state_change_allowed("https://flywheel.internal", "cross-site", "10.0.0.5:8100")
    assert not named.trusted_origin("http://[::1")


async def test_the_recorders_own_admin_api_checks_host_and_origin() -> None:
    """``flywheel recorder`` serves the event-log API on its own port: the same checks."""
    from types import SimpleNamespace

    from infra.eventlog.app import RecorderProcess
    from infra.eventlog.recorder import Recorder
    from infra.eventlog.store import EventStore
    from infra.service import HttpServer

    recorder = cast(Recorder, SimpleNamespace(stats=SimpleNamespace(events=0, last_error=None)))
    process = RecorderProcess(recorder, cast(EventStore, _EmptyLog()))
    server = HttpServer(process.api("test-admin", bound_host="127.0.0.1"), host="127.0.0.1", port=0)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            assert (await c.get("/healthz")).status_code == 200
            _refused(await c.get("/healthz", headers={"Host": EVIL}), 421, "host_not_allowed")
            query = {"sql": "SELECT 1"}
            _refused(
                await c.post("/admin/eventlog/query", json=query, headers={**ADMIN, "Host": EVIL}),
                421,
                "host_not_allowed",
            )
            _refused(
                await c.post(
                    "/admin/eventlog/query", json=query, headers={**ADMIN, "Origin": f"http://{EVIL}"}
                ),
                403,
                "cross_origin_request",
            )
            big = await c.post("/admin/eventlog/query", content=b" " * (2 << 20), headers=ADMIN)
            _refused(big, 413, "body_too_large")
    finally:
        await server.stop()
