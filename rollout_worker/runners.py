"""The agent-runner seam: what every kind of agent (command, callable, Kubernetes Job) gets and returns.

Exceptions:
    AgentSpecError    the agent reference cannot be run (bad command line, import failure, bad template);
                      the episode finishes as ``error`` with this message
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from pydantic import JsonValue

from rollout_worker.llm import LLM
from schemas import AgentRef, EpisodeStatus


class AgentSpecError(Exception):
    def __init__(self, spec: str, reason: str) -> None:
        super().__init__(f"cannot run agent {spec!r}: {reason}")
        self.spec = spec
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AgentRun:
    """One episode's run of one agent."""

    episode_id: str
    agent: AgentRef
    task: dict[str, JsonValue]  # the Task as plain JSON: agents never see Flywheel's models
    llm: LLM
    deadline_s: float  # seconds from now
    deadline_at: datetime

    def env(self) -> dict[str, str]:
        return {
            **self.llm.env(),
            "FLYWHEEL_TASK": json.dumps(self.task),
            "FLYWHEEL_EPISODE_ID": self.episode_id,
        }


@dataclass(slots=True)
class AgentResult:
    status: EpisodeStatus
    output: JsonValue = None
    reward: float | None = None
    error: str | None = None
    agent_s: float = 0.0  # the agent's own run time (process lifetime / function call)
    extra: dict[str, str] = field(default_factory=dict)


class AgentRunner(Protocol):
    async def run(self, run: AgentRun) -> AgentResult:
        """Run the agent to completion, its deadline, or cancellation. Never raises for agent faults."""

    async def aclose(self) -> None: ...


def split_result(value: JsonValue) -> tuple[JsonValue, float | None]:
    """An agent's result → (output, reported reward).

    ``{"reward": r, "output": o}`` reports both; ``{"reward": r}`` alone reports a reward; any other
    value is the output. A reward that is not a finite number is ignored (kept in the output).
    """
    if isinstance(value, dict) and ("reward" in value or "output" in value):
        reward = value.get("reward")
        number = _finite(reward)
        rest = {k: v for k, v in value.items() if k != "reward"} if number is not None else value
        if "output" in rest:
            return rest["output"], number
        return (rest or None), number
    return value, None


def _finite(value: JsonValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def parse_final_line(stdout_tail: str) -> tuple[JsonValue, float | None, bool]:
    """The last stdout line that is a JSON object → (output, reward, found)."""
    for line in reversed(stdout_tail.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            output, reward = split_result(value)
            return output, reward, True
    return None, None, False


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
