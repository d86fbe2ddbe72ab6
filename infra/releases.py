"""Which version of each policy serves production: the release book, folded from ``flywheel.control``.

The trainer proposes candidates (``VersionProposed``), gates evaluate them (``VersionEvaluated``), and an
operator or a rule promotes one (``VersionPromoted``), rolls the served one back (``VersionRolledBack``)
or pins it (``VersionPinned``). A :class:`ReleaseBook` folds these events, in order, into one
:class:`Release` per policy (the whole model, or one LoRA adapter): the served version, the versions
that served before it (what a rollback returns to), and every candidate with its evaluation.

Version 0 is the starting weights (the model directory; for an adapter, the base): it is always known
and serves until something is promoted. ``plan_*`` check a request against the book and return the
event that carries it out, or raise :class:`ReleaseError` with a one-line reason and change nothing;
``apply`` folds an event that is already on the bus (applying one twice changes nothing). The book is
saved as JSON beside the service that keeps it, so a restart serves what served before it, also on a
bus that forgets (the embedded one).
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas import (
    VersionCanary,
    VersionEvaluated,
    VersionPinned,
    VersionPromoted,
    VersionProposed,
    VersionRolledBack,
)
from schemas.control import ReleaseEvent

Status = Literal["served", "canary", "passed", "failed", "rolled_back", "candidate", "retired"]

_VERSIONED = re.compile(r"^(?P<name>.+)@v(?P<version>\d+)$")
_APPLIED_KEPT = 4096  # event ids remembered, so a history read again after a restart is not folded twice


class ReleaseError(ValueError):
    """A release request that cannot be carried out (a failed version, nothing to roll back to, ...)."""


class UnknownVersionError(ReleaseError):
    """A request names a version the book has never seen proposed."""


class InvalidReleaseRequest(ReleaseError):
    """A request that is malformed whatever the book holds (a canary share outside (0, 1))."""


def versioned_name(name: str, version: int) -> str:
    """``policy@v12``: how a call or a rollout names one version of a policy."""
    return f"{name}@v{version}"


def parse_versioned(name: str) -> tuple[str, int] | None:
    """``"policy@v12"`` → ``("policy", 12)``; None for a plain name."""
    m = _VERSIONED.match(name)
    return (m.group("name"), int(m.group("version"))) if m else None


@dataclass
class VersionRecord:
    version: int
    checkpoint_path: str | None = None
    step: int = 0
    proposed_at: str | None = None
    evaluation: dict[str, Any] | None = None  # the last VersionEvaluated, as JSON
    rolled_back: bool = False

    @property
    def passed(self) -> bool | None:
        return None if self.evaluation is None else bool(self.evaluation["passed"])

    def evaluation_rule(self) -> str:
        return str(self.evaluation["rule"]) if self.evaluation else "not evaluated"


@dataclass
class Release:
    """One policy's release state; ``adapter`` None: the whole model."""

    model: str
    adapter: str | None
    served: int = 0
    pinned: bool = False
    previous: list[int] = field(default_factory=list)  # versions that served before, oldest first
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the last promotions, rollbacks, pins
    canary: dict[str, Any] | None = None  # {"version", "share", "since"}: a share of sessions on a candidate

    @property
    def canary_version(self) -> int | None:
        return int(self.canary["version"]) if self.canary else None

    @property
    def name(self) -> str:
        return self.adapter or self.model

    @property
    def latest_candidate(self) -> int | None:
        return max(self.versions, default=None)

    def record(self, version: int) -> VersionRecord | None:
        if version == 0:
            return self.versions.get(0) or VersionRecord(0)
        return self.versions.get(version)

    def status(self, version: int) -> Status:
        rec = self.record(version)
        if version == self.served:
            return "served"
        if version == self.canary_version:
            return "canary"
        if rec is None:
            return "retired"
        if rec.rolled_back:
            return "rolled_back"
        if version in self.previous:
            return "retired"  # it served before
        if rec.passed is None:
            return "candidate"
        return "passed" if rec.passed else "failed"

    def checkpoint(self, version: int) -> str | None:
        """The weights of ``version``: None for version 0 (the engine's own starting weights)."""
        rec = self.record(version)
        return rec.checkpoint_path if rec is not None else None

    def as_json(self) -> dict[str, Any]:
        known = sorted({0, *self.versions})
        return {
            "model": self.model,
            "adapter": self.adapter,
            "name": self.name,
            "served": self.served,
            "pinned": self.pinned,
            "canary": self.canary,
            "previous": list(self.previous),
            "latest_candidate": self.latest_candidate,
            "versions": [self.version_json(v) for v in known],
            "decisions": list(self.decisions),
        }

    def version_json(self, version: int) -> dict[str, Any]:
        rec = self.record(version) or VersionRecord(version)
        return {
            "version": version,
            "status": self.status(version),
            "checkpoint_path": rec.checkpoint_path,
            "step": rec.step,
            "proposed_at": rec.proposed_at,
            "evaluation": rec.evaluation,
        }


class ReleaseBook:
    """Every policy's :class:`Release` for one model, folded from the control topic; see the module doc."""

    def __init__(self, model: str = "policy", path: Path | None = None) -> None:
        self.model = model
        self.path = path
        self.releases: dict[str | None, Release] = {}
        self._applied: deque[str] = deque(maxlen=_APPLIED_KEPT)
        self._applied_set: set[str] = set()
        if path is not None and path.is_file():
            self._load(path)

    def release(self, adapter: str | None = None) -> Release:
        rel = self.releases.get(adapter)
        if rel is None:
            rel = self.releases[adapter] = Release(self.model, adapter)
        return rel

    def served(self, adapter: str | None = None) -> int:
        return self.release(adapter).served

    # ------------------------------------------------------------------ requests (checked, not applied)
    def plan_promote(
        self, version: int, *, adapter: str | None = None, by: str, reason: str = "", rule: bool = False
    ) -> VersionPromoted:
        """The event that makes ``version`` serve; ``rule``: decided by a rule (refused while pinned)."""
        rel = self.release(adapter)
        rec = _servable(rel, version)
        if rule and rec.rolled_back:
            raise ReleaseError(f"{rel.name}: version {version} was rolled back; only an operator promotes it")
        return VersionPromoted(
            producer=by,
            model=self.model,
            adapter=adapter,
            version=version,
            previous=rel.served,
            decided_by=by,
            reason=reason,
            figures=_eval_figures(rec),
        )

    def plan_rollback(
        self,
        *,
        adapter: str | None = None,
        by: str,
        reason: str = "",
        figures: dict[str, float] | None = None,
    ) -> VersionRolledBack:
        """The event that takes the served version out and serves the one before it."""
        rel = self.release(adapter)
        if rel.pinned:
            raise ReleaseError(f"{rel.name}: pinned to version {rel.served}; unpin it first")
        target = next((v for v in reversed(rel.previous) if v != rel.served), None)
        if target is None:
            raise ReleaseError(
                f"{rel.name}: nothing to roll back to (version {rel.served} is the first served)"
            )
        return VersionRolledBack(
            producer=by,
            model=self.model,
            adapter=adapter,
            version=rel.served,
            to=target,
            decided_by=by,
            reason=reason,
            figures=figures or {},
        )

    def plan_pin(
        self, version: int | None, *, adapter: str | None = None, by: str, reason: str = ""
    ) -> VersionPinned:
        """Pin production to ``version`` (it serves from then on), or unpin (None)."""
        rel = self.release(adapter)
        if version is None:
            if not rel.pinned:
                raise ReleaseError(f"{rel.name}: not pinned")
        else:
            if rel.pinned and rel.served == version:
                raise ReleaseError(f"{rel.name}: already pinned to version {version}")
            _servable(rel, version, moving=False)
        return VersionPinned(
            producer=by, model=self.model, adapter=adapter, version=version, decided_by=by, reason=reason
        )

    def plan_canary(
        self, version: int, share: float, *, adapter: str | None = None, by: str, reason: str = ""
    ) -> VersionCanary:
        """Send ``share`` of new production sessions to ``version``; ``share`` must be in (0, 1)."""
        if not 0.0 < share < 1.0:
            raise InvalidReleaseRequest(f"a canary share must be in (0, 1), got {share:g}")
        rel = self.release(adapter)
        _servable(rel, version)
        if rel.canary is not None and rel.canary_version != version:
            raise ReleaseError(f"{rel.name}: version {rel.canary_version} is in canary; end it first")
        return VersionCanary(
            producer=by,
            model=self.model,
            adapter=adapter,
            version=version,
            share=share,
            decided_by=by,
            reason=reason,
        )

    def plan_canary_rollback(
        self,
        *,
        adapter: str | None = None,
        by: str,
        reason: str = "",
        figures: dict[str, float] | None = None,
    ) -> VersionRolledBack:
        """The event that ends the canary with its version rolled back (the served version stays)."""
        rel = self.release(adapter)
        if rel.canary_version is None:
            raise ReleaseError(f"{rel.name}: no canary to roll back")
        return VersionRolledBack(
            producer=by,
            model=self.model,
            adapter=adapter,
            version=rel.canary_version,
            to=rel.served,
            decided_by=by,
            reason=reason,
            figures=figures or {},
        )

    # ------------------------------------------------------------------ folding events
    def apply(self, event: ReleaseEvent) -> bool:
        """Fold one event of the control topic; False when it was folded before or is not this model's."""
        if event.model != self.model or event.event_id in self._applied_set:
            return False
        rel = self.release(event.adapter)
        if isinstance(event, VersionProposed):
            rec = rel.versions.setdefault(event.version, VersionRecord(event.version))
            rec.checkpoint_path, rec.step = event.checkpoint_path, event.step
            rec.proposed_at = event.emitted_at.isoformat()
        elif isinstance(event, VersionEvaluated):
            rec = rel.versions.setdefault(event.version, VersionRecord(event.version))
            rec.evaluation = event.model_dump(mode="json", include=_EVALUATION_FIELDS)
        elif isinstance(event, VersionPromoted):
            _serve(rel, event.version)
            rel.canary = None
            self._decide(rel, event)
        elif isinstance(event, VersionCanary):
            rel.canary = None
            if event.share > 0:
                rel.canary = {
                    "version": event.version,
                    "share": event.share,
                    "since": event.emitted_at.isoformat(),
                }
            self._decide(rel, event)
        elif isinstance(event, VersionRolledBack):
            if event.version in rel.versions:
                rel.versions[event.version].rolled_back = True
            if rel.canary_version == event.version:
                rel.canary = None
            if rel.served == event.version:
                rel.served = event.to
                while rel.previous and rel.previous[-1] in (event.to, event.version):
                    rel.previous.pop()
            self._decide(rel, event)
        else:
            if event.version is not None:
                _serve(rel, event.version)
                rel.canary = None
            rel.pinned = event.version is not None
            self._decide(rel, event)
        self._applied.append(event.event_id)
        self._applied_set = set(self._applied)
        self.save()
        return True

    def _decide(
        self, rel: Release, event: VersionPromoted | VersionRolledBack | VersionPinned | VersionCanary
    ) -> None:
        rel.decisions.append(event.model_dump(mode="json", exclude={"schema_version", "model", "producer"}))
        del rel.decisions[:-20]

    # ------------------------------------------------------------------ persistence
    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "policies": [r.as_json() for r in self._ordered()]}

    def _ordered(self) -> list[Release]:
        return sorted(self.releases.values(), key=lambda r: (r.adapter is not None, r.adapter or ""))

    def save(self) -> None:
        if self.path is None:
            return
        state = {
            "model": self.model,
            "applied": list(self._applied),
            "releases": [
                {
                    "adapter": r.adapter,
                    "served": r.served,
                    "pinned": r.pinned,
                    "previous": r.previous,
                    "canary": r.canary,
                    "decisions": r.decisions,
                    "versions": [vars(rec) for rec in r.versions.values()],
                }
                for r in self._ordered()
            ],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(path.read_text())
            for r in state["releases"]:
                rel = self.release(r["adapter"])
                rel.served, rel.pinned = int(r["served"]), bool(r["pinned"])
                rel.previous, rel.decisions = [int(v) for v in r["previous"]], list(r["decisions"])
                rel.canary = r.get("canary")
                rel.versions = {int(v["version"]): VersionRecord(**v) for v in r["versions"]}
            self._applied.extend(state["applied"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReleaseError(f"cannot read the release book {path}: {exc}") from exc
        self._applied_set = set(self._applied)


_EVALUATION_FIELDS = {"passed", "rule", "figures", "served_figures", "decided_by", "emitted_at"}


def _serve(rel: Release, version: int) -> None:
    if version != rel.served:
        rel.previous.append(rel.served)
        del rel.previous[:-50]
        rel.served = version
    if version in rel.versions:
        rel.versions[version].rolled_back = False


def _servable(rel: Release, version: int, *, moving: bool = True) -> VersionRecord:
    """``version``'s record when it may serve; ``moving``: it is to replace the served one (so the policy
    must not be pinned, and it must not already serve). Raises what a request is refused with."""
    rec = rel.record(version)
    if rec is None:
        raise UnknownVersionError(f"{rel.name}: version {version} is unknown (known: {_known(rel)})")
    if rec.passed is False:
        raise ReleaseError(f"{rel.name}: version {version} failed its gates ({rec.evaluation_rule()})")
    if moving and rel.pinned:
        raise ReleaseError(f"{rel.name}: pinned to version {rel.served}; unpin it first")
    if moving and version == rel.served:
        raise ReleaseError(f"{rel.name}: version {version} already serves")
    return rec


def _known(rel: Release) -> str:
    return ", ".join(str(v) for v in sorted({0, *rel.versions}))


def _eval_figures(rec: VersionRecord) -> dict[str, float]:
    return dict(rec.evaluation["figures"]) if rec.evaluation else {}
