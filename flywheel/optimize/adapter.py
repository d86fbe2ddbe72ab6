"""The two things GEPA needs from Flywheel: an adapter that evaluates candidates, and a reflection LM.

GEPA (Agrawal et al., 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement
Learning", arXiv:2507.19457; the ``gepa`` package) proposes a new text for a component by showing a
reflection model the current text with examples of how it did — inputs, outputs and *textual*
feedback — and keeps the candidates that are best on some validation example (its Pareto frontier).

* :class:`FlywheelAdapter` implements ``gepa.core.adapter.GEPAAdapter``: ``evaluate(batch, candidate,
  capture_traces)`` runs every task as a real rollout under the candidate (:mod:`flywheel.optimize.rollouts`)
  and returns ``EvaluationBatch(outputs, scores, trajectories)``; ``make_reflective_dataset`` turns the
  traces into ``{"Inputs", "Generated Outputs", "Feedback"}`` records, the feedback being the reward
  service's scorer reason plus what the agent told the model. GEPA calls it from its own (synchronous)
  thread; the rollouts run on the stack's event loop.
* :class:`ReflectionLM` is GEPA's ``LanguageModel`` (``(prompt) -> str``) over any OpenAI-compatible
  ``/chat/completions`` endpoint (``--reflection-url``, ``--reflection-model``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import httpx
from gepa.core.adapter import EvaluationBatch, ProposalFn

from flywheel.optimize.rollouts import (
    Candidate,
    EpisodeResult,
    OptimizeError,
    Rollouts,
    prompt_version_of,
)
from schemas import Task


class ReflectionError(OptimizeError):
    """The reflection endpoint failed or answered something that is not a chat completion."""


class ReflectionLM:
    """A reflection model behind an OpenAI-compatible endpoint (GEPA's ``LanguageModel`` protocol)."""

    def __init__(
        self, url: str, model: str, *, api_key: str = "", timeout_s: float = 120.0, temperature: float = 1.0
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.temperature = temperature
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self.calls = 0

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        try:
            response = self._client.post(f"{self.url}/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ReflectionError(
                f"reflection endpoint {self.url} unreachable: {type(exc).__name__}"
            ) from exc
        if response.status_code != 200:
            raise ReflectionError(
                f"reflection endpoint {self.url} answered {response.status_code}: {response.text[:300]}"
            )
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ReflectionError(f"reflection endpoint {self.url} sent no chat completion") from exc
        if not isinstance(content, str) or not content.strip():
            raise ReflectionError(f"reflection endpoint {self.url} sent an empty message")
        self.calls += 1
        return content

    def close(self) -> None:
        self._client.close()


def feedback(result: EpisodeResult) -> str:
    """What the reflection model reads about one episode: the score and its reasons in words."""
    verdict = "solved" if result.reward >= 1.0 else ("partly solved" if result.reward > 0 else "failed")
    parts = [f"{verdict} (reward {result.reward:g}, {result.num_calls} model calls)"]
    if result.note:
        parts.append(f"scorer: {result.note}")
    agent_said = [m["content"] for m in result.transcript if m["role"] in ("user", "tool")][1:]
    if agent_said:
        parts.append("the agent replied to the model: " + " | ".join(t[:200] for t in agent_said[-3:]))
    return "; ".join(parts)


def _conversation(result: EpisodeResult) -> str:
    lines = [
        f"{m['role']}: {m['content']}" for m in result.transcript if m["role"] not in ("system", "developer")
    ]
    return "\n".join(lines)[-4000:] or "(no model call was recorded)"


class FlywheelAdapter:
    """``GEPAAdapter[Task, EpisodeResult, dict]`` over real rollouts through the stack."""

    propose_new_texts: ProposalFn | None = None  # GEPA's own reflective proposal, with ``ReflectionLM``

    def __init__(
        self,
        rollouts: Rollouts,
        loop: asyncio.AbstractEventLoop,
        *,
        on_evaluated: Callable[[str, list[EpisodeResult]], None] | None = None,
    ) -> None:
        self.rollouts = rollouts
        self.loop = loop
        self.on_evaluated = on_evaluated
        self.evaluations: list[dict[str, Any]] = []  # every batch evaluated: version, size, mean

    async def _evaluate(self, batch: Sequence[Task], candidate: Candidate) -> list[EpisodeResult]:
        await self.rollouts.activate(candidate)
        return await self.rollouts.run(batch)

    def evaluate(
        self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch[EpisodeResult, dict[str, Any]]:
        fut: Future[list[EpisodeResult]] = asyncio.run_coroutine_threadsafe(
            self._evaluate(batch, dict(candidate)), self.loop
        )
        results = fut.result()
        version = prompt_version_of(candidate)
        mean = sum(r.reward for r in results) / max(1, len(results))
        self.evaluations.append({"prompt_version": version, "episodes": len(results), "mean_reward": mean})
        if self.on_evaluated is not None:
            self.on_evaluated(version, results)
        return EvaluationBatch(
            outputs=[r.output() for r in results],
            scores=[r.reward for r in results],
            trajectories=results if capture_traces else None,
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: EvaluationBatch[EpisodeResult, dict[str, Any]],
        components_to_update: list[str],
    ) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        records = [
            {
                "Inputs": {"task": _task_text(r.task)},
                "Generated Outputs": _conversation(r),
                "Feedback": feedback(r),
            }
            for r in eval_batch.trajectories or []
        ]
        return {name: records for name in components_to_update}


def _task_text(task: Task) -> str:
    data = task.input
    if isinstance(data, dict) and isinstance(data.get("question"), str):
        return str(data["question"])
    return str(data)[:2000]
