"""``flywheel demo --gates``: the demo's candidates pass gates before they serve production.

With ``--gates`` the stack runs with ``releases=gated`` (gateway/releases.py): production calls (a tenant
key's sessions) are served by each policy's *served* version, training rollouts by the trainer's latest.
The trainer proposes a candidate every ``--release-every`` versions (per adapter for LoRA policies) and
the gate keeper (flywheel/gates.py) evaluates it on the demo's own validation tasks against the served
version, promoting it when the rules hold (:func:`write_gates`):

- ``score`` no lower than the served version's by more than :data:`MARGIN`;
- ``score`` at least :data:`MINIMUM`.

The validation tasks are calculator problems of the held-out split that the report's held-out tasks do
not hold (:func:`validation_tasks`): the users never ask them, the report never scores them. Their
agent (``examples/demo/gate_agent.py``) is the deployed agent's loop (examples/demo/tenants.py ``solve``): a right number
scores 1 in either form, so the gate judges the answer, not its form.

:class:`ReleaseWatch` follows ``flywheel.control`` (every evaluation, promotion and rollback, with the
seconds since the RL phase began) and the versions production calls were recorded with;
:func:`versions_heldout` then scores every version that served production, and every candidate, on
the report's held-out tasks, each asked for by its versioned name (``terse@v20``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.demo.pipeline import evaluate
from examples.demo_agents.calc_agent import tasks as calc_tasks
from infra.bus.base import Bus, Message, Subscription
from infra.releases import ReleaseBook, versioned_name
from schemas import (
    CONTROL,
    EPISODES,
    AgentKind,
    AgentRef,
    LLMCallRecorded,
    Task,
    VersionEvaluated,
    VersionPromoted,
    VersionProposed,
    VersionRolledBack,
)
from schemas.control import RELEASE_EVENTS

if TYPE_CHECKING:
    from flywheel.stack import StackSettings

MARGIN = 0.05  # a candidate may score at most this much below the served version
MINIMUM = 0.05  # and must score at least this (the warm start scores ~0.3)
VALIDATION_TASKS = 48
RELEASE_EVERY = 10
AGENT = "examples.demo.gate_agent:run"  # the deployed agent's loop, either form right
SETTLE_S = 240.0  # how long the report waits for the gates to judge the candidates proposed as RL ended


def agent_ref() -> AgentRef:
    return AgentRef(kind=AgentKind.callable, spec=AGENT)


def validation_tasks(seed: int, n: int, reported: set[str]) -> list[dict[str, Any]]:
    """``n`` held-out-split problems whose ids are none of ``reported`` (the report's held-out tasks)."""
    taken = set(reported)
    out: list[dict[str, Any]] = []
    for task in calc_tasks.tasks("heldout", 30_000 + seed):
        if task["task_id"] not in taken:
            taken.add(task["task_id"])
            out.append(task)
            if len(out) == n:
                return out
    return out


def gated(
    settings: StackSettings,
    directory: Path,
    tasks: list[dict[str, Any]],
    release_every: int,
    agent: str = AGENT,
) -> StackSettings:
    """``settings`` with gated releases: a candidate every ``release_every`` versions, judged by the gates
    of :func:`write_gates` on ``tasks`` run by ``agent``."""
    return settings.replace(
        releases="gated",
        release_gates=write_gates(directory, tasks, agent=agent),
        trainer_release_every=release_every,
    )


def write_gates(
    directory: Path, tasks: list[dict[str, Any]], *, margin: float = MARGIN, agent: str = AGENT
) -> Path:
    """``gates.json`` and its task file under ``directory``; the path of ``gates.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "validation.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    gates = {
        "tasks": "validation.jsonl",
        "agent": agent,
        "rules": [
            {"metric": "score", "max_regression": margin},
            {"metric": "score", "min": MINIMUM},
        ],
        "promote": "auto",
        "deadline_s": 300.0,
        "timeout_s": 900.0,
    }
    path = directory / "gates.json"
    path.write_text(json.dumps(gates, indent=2) + "\n")
    return path


@dataclass
class ReleaseWatch:
    """The release events of ``model`` on ``flywheel.control`` and the versions of production calls."""

    bus: Bus
    model: str
    book: ReleaseBook = field(init=False)
    t0: float = field(default_factory=time.perf_counter)
    events: list[dict[str, Any]] = field(default_factory=list)
    production: dict[str, Counter[int]] = field(default_factory=dict)  # tenant -> adapter version -> calls
    _subs: list[Subscription] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.book = ReleaseBook(self.model)

    async def start(self) -> None:
        group = f"demo-releases-{time.monotonic_ns()}"
        self._subs = [
            await self.bus.subscribe(CONTROL, group, self._on_control, from_beginning=True),
            await self.bus.subscribe(EPISODES, group, self._on_call, from_beginning=False),
        ]

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()

    @classmethod
    async def started(cls, bus: Bus, model: str) -> ReleaseWatch:
        watch = cls(bus, model)
        await watch.start()
        return watch

    def restart_clock(self) -> None:
        self.t0 = time.perf_counter()

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if not isinstance(event, RELEASE_EVENTS) or event.model != self.model:
            return
        self.book.apply(event)
        row: dict[str, Any] = {
            "t": round(time.perf_counter() - self.t0, 1),
            "type": event.type,
            "policy": event.adapter or self.model,
            "version": event.version,
        }
        if isinstance(event, VersionEvaluated):
            row.update(
                passed=event.passed,
                rule=event.rule,
                figures=event.figures,
                served_figures=event.served_figures,
            )
        elif isinstance(event, VersionPromoted):
            row.update(previous=event.previous, decided_by=event.decided_by)
        elif isinstance(event, VersionRolledBack):
            row.update(to=event.to, decided_by=event.decided_by)
        elif not isinstance(event, VersionProposed):
            return
        self.events.append(row)

    async def _on_call(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, LLMCallRecorded) and event.tenant:
            version = event.adapter_version if event.adapter is not None else event.weight_version
            self.production.setdefault(event.tenant, Counter())[int(version or 0)] += 1

    async def settled(self, policies: list[str], timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until each policy's newest candidate has been evaluated: the gate
        keeper evaluates the newest pending one, so the candidates proposed as RL ended are judged too."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if all(self._newest_evaluated(p) for p in policies):
                return True
            await asyncio.sleep(1.0)
        return False

    def _newest_evaluated(self, policy: str) -> bool:
        proposed = [e["version"] for e in self.of("version_proposed", policy)]
        evaluated = {e["version"] for e in self.of("version_evaluated", policy)}
        return not proposed or max(proposed) in evaluated

    def of(self, kind: str, policy: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind and e["policy"] == policy]

    def served_timeline(self, policy: str) -> list[dict[str, Any]]:
        """When each version began to serve ``policy``'s production calls: version 0 at 0 s, then each
        promotion (a rollback's target, too)."""
        timeline: list[dict[str, Any]] = [{"t": 0.0, "version": 0}]
        for e in self.events:
            if e["policy"] != policy:
                continue
            if e["type"] == "version_promoted":
                timeline.append({"t": e["t"], "version": e["version"], "by": e["decided_by"]})
            elif e["type"] == "version_rolled_back":
                timeline.append({"t": e["t"], "version": e["to"], "by": e["decided_by"]})
        return timeline

    def summary(self, policy: str) -> dict[str, Any]:
        evaluated = self.of("version_evaluated", policy)
        return {
            "served": self.book.served(None if policy == self.model else policy),
            "proposed": [e["version"] for e in self.of("version_proposed", policy)],
            "refused": [e["version"] for e in evaluated if not e["passed"]],
            "promoted": [e["version"] for e in self.of("version_promoted", policy)],
            "served_timeline": self.served_timeline(policy),
            "evaluations": evaluated,
        }


async def versions_heldout(
    bus: Bus, policy: str, versions: list[int], heldout: list[Task], agent: AgentRef | None = None
) -> dict[int, dict[str, float]]:
    """Held-out accuracy of each of ``versions`` of ``policy`` (asked for as ``policy@vN``, ``mode=val``)."""
    out: dict[int, dict[str, float]] = {}
    for version in sorted(set(versions)):
        model = versioned_name(policy, version)
        result = await evaluate(bus, heldout, agent or agent_ref(), model=model, timeout_s=900.0)
        out[version] = {
            "accuracy": round(result.success, 4),
            "calls_per_episode": round(result.calls_per_episode, 3),
            "episodes": float(result.episodes),
            "errors": float(result.errors),
        }
    return out


def served_over_time(
    timeline: list[dict[str, Any]], accuracy: dict[int, dict[str, float]]
) -> list[dict[str, Any]]:
    """The served timeline with each version's held-out accuracy beside it."""
    return [{**row, "heldout_accuracy": accuracy.get(row["version"], {}).get("accuracy")} for row in timeline]


def pick_versions(summary: dict[str, Any], most: int = 6) -> list[int]:
    """The versions to score on the held-out tasks: every one that served, and up to ``most`` candidates
    (evenly spread, the last always among them)."""
    served = [row["version"] for row in summary["served_timeline"]]
    candidates = sorted(set(summary["proposed"]))
    if len(candidates) > most:
        step = len(candidates) / most
        candidates = sorted({candidates[int(i * step)] for i in range(most)} | {candidates[-1]})
    return sorted(set(served) | set(candidates))


async def releases_report(
    bus: Bus, watch: ReleaseWatch, policies: list[str], heldout: list[Task], agent: AgentRef | None = None
) -> dict[str, Any]:
    """Per policy: its candidates, the gates' decisions, the served timeline, and the held-out accuracy of
    every version that served and of the candidates (:func:`pick_versions`)."""
    out: dict[str, Any] = {}
    settled = await watch.settled(policies, SETTLE_S)
    for policy in policies:
        summary = {**watch.summary(policy), "newest_candidate_evaluated": settled}
        accuracy = await versions_heldout(bus, policy, pick_versions(summary), heldout, agent)
        out[policy] = {
            **summary,
            "served_over_time": served_over_time(summary["served_timeline"], accuracy),
            "heldout_by_version": {str(v): a for v, a in accuracy.items()},
        }
    return out


def production_versions(watch: ReleaseWatch) -> dict[str, dict[str, int]]:
    """Per tenant, the versions its production calls were recorded with, and how many calls each."""
    return {t: {str(v): n for v, n in sorted(c.items())} for t, c in sorted(watch.production.items())}


async def whole_model_report(
    bus: Bus, watch: ReleaseWatch, heldout: list[Task], agent: AgentRef, say: Callable[[str], None]
) -> dict[str, Any]:
    """``--gates`` for a whole-model policy: its releases (:func:`releases_report`) and the served
    version's held-out success."""
    say(f"scoring the served versions and the candidates of {watch.model} on the held-out tasks")
    releases = await releases_report(bus, watch, [watch.model], heldout, agent)
    rel = releases[watch.model]
    served = rel["heldout_by_version"].get(str(rel["served"]), {})
    say(
        f"served v{rel['served']}: success {100 * (served.get('accuracy') or 0):.1f}%; "
        f"refused {rel['refused']}, promoted {rel['promoted']}"
    )
    return {
        "releases": releases,
        "served": {"version": rel["served"], "success": served.get("accuracy")},
        "production_versions": production_versions(watch),
    }
