"""Per-tenant quotas through the real gateway server (uvicorn on loopback, the fake upstream behind it).

Tenant A at its session cap gets a 429 in OpenAI's error format (with ``Retry-After``) while tenant B's
sessions keep working and B's feedback is accepted; A flooding the Responses API store drops A's own
oldest responses, never B's ``previous_response_id`` chain (nor under the global byte cap); A past its
requests or tokens per minute gets a 429 before the upstream is called, B and training episodes are
unaffected; ``/metrics`` counts every refusal by tenant and quota.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.gateway_harness import ADMIN, BackgroundGateway

pytestmark = pytest.mark.timeout(90)
MSGS = [{"role": "user", "content": "What is 2+2?"}]


def _key(gw: BackgroundGateway, tenant: str) -> dict[str, str]:
    _, key = gw.h.keystore.create(tenant)
    return {"Authorization": f"Bearer {key}"}


def _chat(c: httpx.Client, auth: dict[str, str], session: str | None = None) -> httpx.Response:
    headers = {**auth, **({"X-Flywheel-Session": session} if session else {})}
    return c.post("/v1/chat/completions", json={"model": "policy", "messages": MSGS}, headers=headers)


def _refused(r: httpx.Response, code: str) -> dict[str, Any]:
    """A quota's 429: OpenAI's error shape, its code, and a Retry-After of whole seconds."""
    assert r.status_code == 429, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", code), error
    assert int(r.headers["retry-after"]) >= 1
    return error


def _refusals(gw: BackgroundGateway) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{gw.url}/metrics", headers=ADMIN, timeout=10).text
    return {
        (s.labels["tenant"], s.labels["quota"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "flywheel_gateway_quota_refusals"
        for s in family.samples
        if s.name == "flywheel_gateway_quota_refusals_total"
    }


def test_a_tenant_at_its_session_cap_is_refused_and_the_others_keep_theirs(tmp_path: Path) -> None:
    with (
        BackgroundGateway(tmp_path, tenant_max_sessions=3, max_episodes=8) as gw,
        httpx.Client(base_url=gw.url, timeout=10) as c,
    ):
        a, b = _key(gw, "tenant-a"), _key(gw, "tenant-b")
        b_episodes = {s: _chat(c, b, s).headers["x-flywheel-episode"] for s in ("b-1", "b-2")}
        a_first = _chat(c, a, "a-1").headers["x-flywheel-episode"]
        assert all(_chat(c, a, s).status_code == 200 for s in ("a-2", "a-3"))
        called = len(gw.h.config.requests)

        _refused(_chat(c, a, "a-4"), "tenant_sessions")
        _refused(_chat(c, a), "tenant_sessions")  # a call without a session would open one too
        assert len(gw.h.config.requests) == called  # refused before the upstream
        sdk = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=a["Authorization"][7:], max_retries=0)
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], user="a-5"
            )

        # A's open sessions keep working; B's are untouched, B opens more and its feedback is taken
        assert _chat(c, a, "a-1").headers["x-flywheel-episode"] == a_first
        for session, episode in b_episodes.items():
            assert _chat(c, b, session).headers["x-flywheel-episode"] == episode
        assert _chat(c, b, "b-3").status_code == 200
        fb = c.post("/v1/feedback", json={"session_id": "b-1", "rating": 1}, headers=b)
        assert fb.status_code == 200 and fb.json()["session_open"] is True, fb.text
        assert fb.json()["episode_id"] == b_episodes["b-1"]

        # ending one of A's sessions makes room for another
        assert c.post("/v1/sessions/a-1/end", headers=a).status_code == 200
        assert _chat(c, a, "a-4").status_code == 200
        assert _refusals(gw) == {("tenant-a", "sessions"): 3.0}

        # training episodes keep the registry's last-resort cap (max_episodes 8) to themselves: they
        # push out their own oldest, never a tenant's session
        training = [gw.open_episode() for _ in range(6)]
        assert gw.h.gateway.episodes.get(training[0]) is None and gw.h.gateway.episodes.get(training[-1])
        for session, episode in b_episodes.items():
            assert _chat(c, b, session).headers["x-flywheel-episode"] == episode


def test_a_tenant_flooding_the_response_store_keeps_to_its_own_bytes(tmp_path: Path) -> None:
    with BackgroundGateway(tmp_path, tenant_response_store_bytes=8_000) as gw:
        a, b = _key(gw, "tenant-a"), _key(gw, "tenant-b")
        client_a = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=a["Authorization"][7:], max_retries=0)
        client_b = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=b["Authorization"][7:], max_retries=0)
        b1 = client_b.responses.create(model="policy", input="Remember the number 7.")
        b2 = client_b.responses.create(model="policy", input="And 8.", previous_response_id=b1.id)
        store = gw.h.gateway.responses
        b_bytes = store.bytes_of("tenant-b")

        flood = [client_a.responses.create(model="policy", input="x" * 200) for _ in range(20)]
        assert 0 < store.bytes_of("tenant-a") <= 8_000 and store.bytes_of("tenant-b") == b_bytes
        with pytest.raises(openai.NotFoundError):  # A's own oldest went
            client_a.responses.create(model="policy", input="again", previous_response_id=flood[0].id)
        b3 = client_b.responses.create(model="policy", input="And 9.", previous_response_id=b2.id)
        assert b3.previous_response_id == b2.id

        # the global cap, as a last resort, takes from the tenant that pushes past it, not from B
        store.max_bytes, store.per_tenant_bytes = store.bytes + 2_000, 0
        for _ in range(20):
            client_a.responses.create(model="policy", input="y" * 200)
        assert store.bytes <= store.max_bytes
        b4 = client_b.responses.create(model="policy", input="And 10.", previous_response_id=b3.id)
        assert b4.previous_response_id == b3.id
        metrics = httpx.get(f"{gw.url}/metrics", headers=ADMIN, timeout=10).text
        assert 'flywheel_gateway_quota_evictions_total{tenant="tenant-a"}' in metrics
        assert 'flywheel_gateway_quota_evictions_total{tenant="tenant-b"}' not in metrics


def test_requests_and_tokens_per_minute_are_per_tenant(tmp_path: Path) -> None:
    with (
        BackgroundGateway(tmp_path, tenant_requests_per_minute=3) as gw,
        httpx.Client(base_url=gw.url, timeout=10) as c,
    ):
        a, b = _key(gw, "tenant-a"), _key(gw, "tenant-b")
        assert all(_chat(c, a, "a").status_code == 200 for _ in range(3))
        called = len(gw.h.config.requests)
        error = _refused(_chat(c, a, "a"), "tenant_requests_per_minute")
        assert "FLYWHEEL_TENANT_REQUESTS_PER_MINUTE" in error["message"]
        r = _chat(c, a, "a")
        assert r.status_code == 429 and 15 <= int(r.headers["retry-after"]) <= 20  # a call back in 20s
        body = {"model": "policy", "max_tokens": 8, "messages": MSGS}
        messages = c.post("/v1/messages", json=body, headers=a)  # in Anthropic's error format there
        assert messages.status_code == 429 and messages.json()["error"]["type"] == "rate_limit_error"
        assert len(gw.h.config.requests) == called  # none of them reached the upstream
        assert all(_chat(c, b, "b").status_code == 200 for _ in range(3))  # B has its own minute
        url = gw.episode_url(gw.open_episode())  # training episodes have no tenant quota
        assert all(
            httpx.post(f"{url}/chat/completions", json={"messages": MSGS}, timeout=10).status_code == 200
            for _ in range(5)
        )

        # a minute's tokens: what one such call uses (prompt + completion, as the gateway records them)
        gw.h.settings.tenant_requests_per_minute = 0
        used = _chat(c, b, "b").json()["usage"]["total_tokens"]
        gw.h.settings.tenant_tokens_per_minute = used
        t = _key(gw, "tenant-t")
        assert _chat(c, t, "t").status_code == 200  # charged once recorded: its minute is spent
        called = len(gw.h.config.requests)
        _refused(_chat(c, t, "t"), "tenant_tokens_per_minute")
        _refused(_chat(c, t, "t"), "tenant_tokens_per_minute")
        assert len(gw.h.config.requests) == called
        assert _chat(c, b, "b").status_code == 200
        assert _refusals(gw) == {
            ("tenant-a", "requests_per_minute"): 3.0,
            ("tenant-t", "tokens_per_minute"): 2.0,
        }
