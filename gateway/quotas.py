"""Per-tenant quotas: one tenant's traffic never takes what another tenant's sessions hold.

Each is a setting (``FLYWHEEL_TENANT_*``, 0: unlimited) and counts one gateway's traffic:

- **open sessions** (``tenant_max_sessions``): a call that would open one more production session of a
  tenant at its cap is refused; its open sessions keep working, and no other tenant's session is ever
  evicted for it (gateway/episodes/registry.py keeps the global ``max_episodes`` only as a last resort,
  within the newcomer's owner first). A call without a session opens an episode of its own, so it
  counts until that episode ends (the client ends it, or the reward service after ``idle_timeout_s``).
- **response bytes** (``tenant_response_store_bytes``): the Responses API store drops the tenant's own
  least recently used responses past it (gateway/protocols/response_store.py), never another's.
- **requests and tokens per minute** (``tenant_requests_per_minute``, ``tenant_tokens_per_minute``):
  a token bucket per tenant that holds a minute's worth and refills evenly, checked before the call's
  body is read and long before the upstream is called. The tokens charged are those the gateway
  records for the call (``LLMCallRecorded.prompt_tokens + completion_tokens``, the upstream's usage),
  once it is recorded; a call is refused while its tenant's bucket is spent. No estimate is made up
  front (``max_tokens`` is often absent and only a ceiling), so a tenant can overshoot by the calls it
  has in flight when its bucket runs dry; that overshoot is paid back before its next call is admitted.

A refusal is :class:`gateway.errors.QuotaExceededError` (429, ``rate_limit_exceeded``, a
``Retry-After``) and counts in ``flywheel_gateway_quota_refusals_total{tenant, quota}``. Training
episodes (no tenant) have none of these quotas. Memory is bounded: one bucket per tenant that has a key
(buckets back to full are dropped past ``MAX_BUCKETS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.episodes.registry import EpisodeRegistry
from gateway.errors import QuotaExceededError
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from schemas import EpisodeSource, LLMCallRecorded

MAX_BUCKETS = 4096


class Buckets:
    """One token bucket per tenant: ``per_minute`` at most, refilled at ``per_minute / 60`` a second."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._level: dict[str, tuple[float, float]] = {}  # tenant → (level, when)

    def level(self, tenant: str, per_minute: int) -> float:
        now = self._clock()
        level, when = self._level.get(tenant, (float(per_minute), now))
        return min(float(per_minute), level + (now - when) * per_minute / 60.0)

    def wait_s(self, tenant: str, per_minute: int) -> float:
        """Seconds until the bucket holds one again; 0 when it does now."""
        level = self.level(tenant, per_minute)
        return 0.0 if level >= 1.0 else (1.0 - level) * 60.0 / per_minute

    def take(self, tenant: str, per_minute: int, n: float) -> None:
        """Take ``n`` (the level may go below zero: tokens spent past it are paid back first)."""
        self._level[tenant] = (self.level(tenant, per_minute) - n, self._clock())
        if len(self._level) > MAX_BUCKETS:  # a full bucket is the same as none
            for name in [t for t in self._level if self.level(t, per_minute) >= per_minute]:
                del self._level[name]


class TenantQuotas:
    """The quotas of the tenants behind production keys; reads the limits from ``settings`` each time."""

    def __init__(
        self,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.requests = Buckets(clock)
        self.tokens = Buckets(clock)

    def refuse(self, tenant: str, quota: str, message: str, retry_after_s: float) -> QuotaExceededError:
        """The 429 for ``tenant`` past ``quota``, counted."""
        self.metrics.quota_refusals.labels(tenant, quota).inc()
        return QuotaExceededError(
            message, tenant=tenant, quota=quota, retry_after_s=retry_after_s, code=f"tenant_{quota}"
        )

    def admit(self, tenant: str) -> None:
        """Before a production call is read: refused past its tenant's requests or tokens per minute."""
        rpm, tpm = self.settings.tenant_requests_per_minute, self.settings.tenant_tokens_per_minute
        if rpm > 0 and (wait := self.requests.wait_s(tenant, rpm)) > 0:
            raise self.refuse(
                tenant,
                "requests_per_minute",
                f"tenant {tenant!r} is past its {rpm} requests per minute "
                "(FLYWHEEL_TENANT_REQUESTS_PER_MINUTE); retry after Retry-After seconds",
                wait,
            )
        if tpm > 0 and (wait := self.tokens.wait_s(tenant, tpm)) > 0:
            raise self.refuse(
                tenant,
                "tokens_per_minute",
                f"tenant {tenant!r} has spent its {tpm} tokens per minute "
                "(FLYWHEEL_TENANT_TOKENS_PER_MINUTE); retry after Retry-After seconds",
                wait,
            )
        if rpm > 0:
            self.requests.take(tenant, rpm, 1)

    def charge(self, event: LLMCallRecorded) -> None:
        """A recorded production call's prompt + completion tokens, charged to its tenant."""
        tpm = self.settings.tenant_tokens_per_minute
        if tpm > 0 and event.tenant is not None and event.source is EpisodeSource.production:
            self.tokens.take(event.tenant, tpm, event.prompt_tokens + event.completion_tokens)

    def charging(self, then: Callable[[LLMCallRecorded], None]) -> Callable[[LLMCallRecorded], None]:
        """What a recorded call does: its tokens charged (:meth:`charge`), then ``then``."""

        def on_recorded(event: LLMCallRecorded) -> None:
            self.charge(event)
            then(event)

        return on_recorded

    def evicted(self, tenant: str) -> None:
        """A response of ``tenant`` dropped from the response store for its bytes quota."""
        self.metrics.quota_evictions.labels(tenant).inc()

    def check_sessions(self, tenant: str, episodes: EpisodeRegistry) -> None:
        """Before a call opens a session of ``tenant``: refused while it holds ``tenant_max_sessions``.
        Retry-After: when its least recently used session would be closed as idle."""
        cap = self.settings.tenant_max_sessions
        if cap <= 0 or episodes.open_of(tenant) < cap:
            return
        oldest = episodes.least_recent_of(tenant)
        idle = time.monotonic() - oldest.last_active if oldest is not None else 0.0
        raise self.refuse(
            tenant,
            "sessions",
            f"tenant {tenant!r} has {cap} open sessions (FLYWHEEL_TENANT_MAX_SESSIONS); end one "
            "(POST /v1/sessions/{id}/end) or continue an open one",
            self.settings.idle_timeout_s - idle,
        )
