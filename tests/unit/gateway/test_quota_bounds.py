"""The bounds behind the per-tenant quotas, without HTTP: the registry's last-resort cap, the response
store's per-tenant bytes, and the token buckets (a fake clock).

The same quotas through the real server: tests/integration/gateway/test_tenant_quotas.py.
"""

from __future__ import annotations

import pytest

from gateway.episodes.registry import EpisodeRegistry
from gateway.errors import QuotaExceededError
from gateway.metrics import GatewayMetrics
from gateway.protocols.response_store import Kept, ResponseStore
from gateway.quotas import Buckets, TenantQuotas
from gateway.settings import GatewaySettings
from schemas import EpisodeSource, EpisodeStarted, LLMCallRecorded, new_episode_id

pytestmark = pytest.mark.timeout(30)


def _open(reg: EpisodeRegistry, tenant: str | None) -> str:
    episode_id = new_episode_id()
    source = EpisodeSource.live if tenant is None else EpisodeSource.production
    session = None if tenant is None else f"s-{episode_id}"
    reg.open(EpisodeStarted(episode_id=episode_id, source=source, tenant=tenant, session_id=session))
    return episode_id


def test_the_registry_cap_evicts_within_the_newcomers_owner_first() -> None:
    reg = EpisodeRegistry(max_episodes=4)
    b = [_open(reg, "b") for _ in range(2)]
    a = [_open(reg, "a") for _ in range(2)]
    a.append(_open(reg, "a"))  # over the cap: A's own oldest goes, never B's
    assert reg.get(a[0]) is None and all(reg.get(e) for e in [*b, *a[1:]])
    assert (reg.open_of("a"), reg.open_of("b")) == (2, 2)
    t = _open(reg, None)  # training, its owner's only one: an oldest of the biggest owner goes
    assert reg.get(t) is not None and len(reg) == 4
    t2 = _open(reg, None)  # from now on training pushes out its own
    assert reg.get(t) is None and reg.get(t2) is not None and len(reg) == 4
    reg.session("a", f"s-{a[1]}")  # a call in a session makes it the most recently used
    oldest = reg.least_recent_of("a")
    assert oldest is not None and oldest.episode_id == a[2]
    reg.finish(a[1])
    reg.finish(a[2])
    assert reg.open_of("a") == 0 and reg.least_recent_of("a") is None


def _kept(tenant: str | None, size: int, episode: str = "ep") -> Kept:
    return Kept(episode, tenant, "s", [], b"", None, None, size)


def test_the_response_store_drops_a_tenants_own_oldest_past_its_bytes() -> None:
    evicted: list[str] = []
    store = ResponseStore(max_bytes=1_000, per_tenant_bytes=300, on_evicted=evicted.append)
    store.put("b1", _kept("b", 100, "eb"))
    for i in range(10):
        store.put(f"a{i}", _kept("a", 100, f"ea{i}"))
    assert store.bytes_of("a") == 300 and store.get("a6") is None and store.get("a9") is not None
    assert store.get("b1") is not None and evicted == ["a"] * 7
    store.per_tenant_bytes = 0
    for i in range(10, 20):  # the global cap: A's own oldest, not B's older one
        store.put(f"a{i}", _kept("a", 100, f"ea{i}"))
    assert store.bytes <= 1_000 and store.get("b1") is not None
    store.put("t1", _kept(None, 100, "et"))  # training, its owner's only one: the biggest owner pays
    assert store.get("t1") is not None and store.bytes_of("a") == 800 and store.bytes <= 1_000


def test_buckets_hold_a_minute_and_refill_evenly() -> None:
    now = [0.0]
    buckets = Buckets(lambda: now[0])
    for _ in range(3):
        assert buckets.wait_s("a", 3) == 0
        buckets.take("a", 3, 1)
    assert buckets.wait_s("a", 3) == pytest.approx(20.0)
    assert buckets.wait_s("b", 3) == 0
    now[0] = 10.0
    assert buckets.wait_s("a", 3) == pytest.approx(10.0)
    now[0] = 20.0
    assert buckets.wait_s("a", 3) == 0
    buckets.take("t", 60, 150)  # spent past it: paid back before the next call (90 tokens: 90 s)
    assert buckets.wait_s("t", 60) == pytest.approx(91.0)


def test_tokens_are_charged_from_recorded_production_calls_only() -> None:
    settings = GatewaySettings(tenant_tokens_per_minute=100)
    metrics = GatewayMetrics()
    quotas = TenantQuotas(settings, metrics, clock=lambda: 0.0)
    seen: list[LLMCallRecorded] = []
    on_recorded = quotas.charging(seen.append)

    def call(tenant: str | None, source: EpisodeSource) -> LLMCallRecorded:
        return LLMCallRecorded(
            episode_id=new_episode_id(),
            call_seq=0,
            call_id="c",
            source=source,
            tenant=tenant,
            request="{}",
            response="{}",
            prompt_tokens=60,
            completion_tokens=40,
        )

    on_recorded(call(None, EpisodeSource.live))
    on_recorded(call("a", EpisodeSource.production))
    assert len(seen) == 2
    quotas.admit("b")
    with pytest.raises(QuotaExceededError) as refused:
        quotas.admit("a")
    assert (refused.value.status_code, refused.value.code) == (429, "tenant_tokens_per_minute")
    assert refused.value.headers["Retry-After"] == "1"
    assert b'flywheel_gateway_quota_refusals_total{quota="tokens_per_minute",tenant="a"} 1.0' in (
        metrics.render()
    )
