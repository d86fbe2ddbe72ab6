"""The canary's judge: a share of production sessions on a candidate, compared with the served version's.

While a canary runs (``VersionCanary``), the judge reads ``flywheel.episodes``: which version answered
each production session (its calls' recorded version), the users' ratings (``RewardReported`` with
origin ``feedback``: a rating above 0, or a value above 0, is a thumbs up), each call's status and
latency. After every rating it runs a sequential test on the thumbs-up rates of the two arms, the mixture
sequential probability ratio test of Johari, Pekelis and Walsh ("Always valid inference", 2017, eq. 11):

    Λ = sqrt(V / (V + τ²)) · exp(τ² Δ² / (2 V (V + τ²)))     V = p̄(1 − p̄)(1/n_canary + 1/n_served)

with Δ the canary's rate minus the served version's and p̄ the pooled rate. Stopping the first time
Λ ≥ 1/α keeps the chance of a wrong decision (promoting a version that is not better, rolling back one
that is not worse) at most α however often it is checked. Λ ≥ 1/α with Δ > 0 promotes the canary
(``VersionPromoted``), with Δ < 0 rolls it back (``VersionRolledBack``). Guards roll back earlier: an
error rate above the served version's by more than ``max_error_increase``, or a median latency above
``max_latency_ratio`` times the served version's. A canary that reaches ``max_sessions`` rated sessions
without a decision is rolled back: the served version stays. Every decision carries the figures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from infra.logging import get_logger
from infra.releases import ReleaseBook, ReleaseError
from schemas import (
    EpisodeSource,
    EpisodeStarted,
    LLMCallRecorded,
    RewardOrigin,
    RewardReported,
    VersionPromoted,
    VersionRolledBack,
)

log = get_logger("flywheel.canary")


class CanaryConfig(BaseModel):
    """``gates.json``'s ``canary``: a candidate that passed its gates is canaried instead of promoted."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(gt=0.0, lt=1.0, description="the share of production sessions it gets")
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0, description="the chance of a wrong decision")
    tau: float = Field(default=0.2, gt=0.0, description="the mixture's spread: the effect size expected")
    min_sessions: int = Field(default=20, ge=1, description="rated sessions per arm before any decision")
    max_sessions: int = Field(default=2000, ge=1, description="rated canary sessions before it gives up")
    max_error_increase: float = Field(default=0.05, ge=0.0)
    max_latency_ratio: float = Field(default=2.0, gt=1.0)


def msprt(ups_a: int, n_a: int, ups_b: int, n_b: int, tau: float) -> tuple[float, float]:
    """(Λ, Δ) for arm b's rate minus arm a's; Λ = 1 (no evidence) while the pooled rate is 0 or 1."""
    if n_a == 0 or n_b == 0:
        return 1.0, 0.0
    delta = ups_b / n_b - ups_a / n_a
    pooled = (ups_a + ups_b) / (n_a + n_b)
    v = pooled * (1 - pooled) * (1 / n_a + 1 / n_b)
    if v <= 0:
        return 1.0, delta
    t2 = tau * tau
    return math.sqrt(v / (v + t2)) * math.exp(t2 * delta * delta / (2 * v * (v + t2))), delta


@dataclass
class Arm:
    """One version's production sessions while the canary runs."""

    ratings: dict[str, bool] = field(default_factory=dict)  # episode → thumbs up (its last rating)
    calls: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def ups(self) -> int:
        return sum(self.ratings.values())

    def figures(self, prefix: str) -> dict[str, float]:
        n = len(self.ratings)
        return {
            f"{prefix}_sessions": float(n),
            f"{prefix}_thumbs_up_rate": self.ups / n if n else 0.0,
            f"{prefix}_calls": float(self.calls),
            f"{prefix}_error_rate": self.errors / self.calls if self.calls else 0.0,
            f"{prefix}_latency_ms_p50": statistics.median(self.latencies) if self.latencies else 0.0,
        }


@dataclass
class CanaryJudge:
    """Watches one policy's canary and publishes its end; ``observe`` takes every ``flywheel.episodes`` event."""

    config: CanaryConfig
    book: ReleaseBook
    publish: Callable[[VersionPromoted | VersionRolledBack], Awaitable[None]]
    adapter: str | None = None
    production: set[str] = field(default_factory=set)  # production episodes (the keeper's, shared)
    arms: dict[int, Arm] = field(default_factory=dict)
    _version_of: dict[str, int] = field(default_factory=dict)  # production episode → the version it got
    _decided: set[int] = field(default_factory=set)

    def reset(self) -> None:
        self.arms.clear()
        self._version_of.clear()

    async def observe(self, event: object) -> None:
        if isinstance(event, EpisodeStarted) and event.source is EpisodeSource.production:
            self.production.add(event.episode_id)
        elif isinstance(event, LLMCallRecorded) and event.episode_id in self.production:
            if event.adapter != self.adapter:
                return
            version = event.adapter_version if self.adapter is not None else event.weight_version
            if version is None:
                return
            self._version_of[event.episode_id] = version
            arm = self.arms.setdefault(version, Arm())
            arm.calls += 1
            arm.errors += event.status_code != 200
            arm.latencies.append(event.latency_ms)
        elif isinstance(event, RewardReported) and event.origin is RewardOrigin.feedback:
            version = self._version_of.get(event.episode_id)
            if version is None:
                return
            up = (event.rating if event.rating is not None else (event.value or 0.0)) > 0
            self.arms.setdefault(version, Arm()).ratings[event.episode_id] = up
            await self.decide()

    def figures(self) -> dict[str, float]:
        rel = self.book.release(self.adapter)
        canary, served = self.arms.get(rel.canary_version or -1, Arm()), self.arms.get(rel.served, Arm())
        lam, delta = msprt(served.ups, len(served.ratings), canary.ups, len(canary.ratings), self.config.tau)
        return {
            **canary.figures("canary"),
            **served.figures("served"),
            "delta": delta,
            "likelihood_ratio": lam,
            "threshold": 1 / self.config.alpha,
        }

    async def decide(self) -> None:
        """Promote or roll back the canary when the test or a guard says so; nothing otherwise."""
        rel = self.book.release(self.adapter)
        version = rel.canary_version
        if version is None or version in self._decided:
            return
        canary, served = self.arms.get(version, Arm()), self.arms.get(rel.served, Arm())
        c = self.config
        if min(len(canary.ratings), len(served.ratings)) < c.min_sessions:
            return
        figures = self.figures()
        verdict: str | None = None
        if figures["canary_error_rate"] > figures["served_error_rate"] + c.max_error_increase:
            verdict = "rollback: errors"
        elif figures["canary_latency_ms_p50"] > c.max_latency_ratio * max(
            figures["served_latency_ms_p50"], 1.0
        ):
            verdict = "rollback: latency"
        elif figures["likelihood_ratio"] >= figures["threshold"]:
            verdict = "promote: thumbs up higher" if figures["delta"] > 0 else "rollback: thumbs up lower"
        elif len(canary.ratings) >= c.max_sessions:
            verdict = "rollback: no decision within max_sessions"
        if verdict is None:
            return
        self._decided.add(version)
        rule = f"canary {verdict} (Λ {figures['likelihood_ratio']:.3g}, threshold {figures['threshold']:.3g})"
        try:
            if verdict.startswith("promote"):
                event: VersionPromoted | VersionRolledBack = self.book.plan_promote(
                    version, adapter=self.adapter, by="canary", reason=rule, rule=True
                )
                event = event.model_copy(update={"figures": figures})
            else:
                event = self.book.plan_canary_rollback(
                    adapter=self.adapter, by="canary", reason=rule, figures=figures
                )
        except ReleaseError as exc:  # pinned meanwhile, or promoted by an operator: nothing to decide
            log.info("canary not decided", version=version, why=str(exc))
            return
        log.info("canary decided", version=version, verdict=verdict, **figures)
        await self.publish(event)
