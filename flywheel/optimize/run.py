"""``flywheel optimize`` top-down: seed → GEPA over real rollouts → held-out check → report → activate.

1. The component: the agent's system message by default, read from a recorded call of one probe
   rollout (the gateway sees it in every call), or the text given with ``--original-prompt``.
2. GEPA (``gepa.optimize``) evolves the component from the seed (the agent's own text, or
   ``--seed-prompt``): every evaluation is a real rollout through worker → agent → gateway (which
   substitutes the candidate) → engine → reward service; the scorer's reasons are the feedback it
   reflects on; the reflection model is any OpenAI-compatible endpoint. Budget: metric calls (one per
   episode) and wall-clock seconds, whichever ends first.
3. The seed and the winner are run on held-out tasks, which GEPA never saw.
4. ``report.json`` (candidates, lineage, Pareto frontier, validation and held-out scores), a plot of
   validation score per candidate, the winning prompt; with ``activate`` the winner becomes the
   gateway's active prompt version through the control event.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gepa.api import optimize
from gepa.core.result import GEPAResult
from gepa.utils.stop_condition import TimeoutStopCondition

from flywheel.optimize.adapter import FlywheelAdapter, ReflectionLM
from flywheel.optimize.rollouts import (
    Candidate,
    ComponentSpec,
    EpisodeResult,
    OptimizeError,
    Rollouts,
    prompt_version_of,
)
from schemas import Task

Say = Callable[[str], None]
Tick = Callable[[int, int], None]  # (metric calls used, budget)


@dataclass
class OptimizeConfig:
    out: Path
    train: list[Task]
    val: list[Task]
    test: list[Task] = field(default_factory=list)
    component: str = "system_prompt"
    match: str = "system"
    original: str | None = None  # None: read the agent's system message from a probe rollout
    seed_prompt: str | None = None  # None: start from the original
    reflection_url: str = ""
    reflection_model: str = ""
    reflection_api_key: str = ""
    max_metric_calls: int = 200
    max_seconds: float = 300.0
    minibatch: int = 4
    seed: int = 0
    accept: str = "strict"  # GEPA's acceptance of a proposal on its minibatch: strict | equal improvement
    activate: bool = False


def _summary(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    n = max(1, len(results))
    return {
        "success": round(sum(1 for r in results if r.reward >= 1.0) / n, 4),
        "reward": round(sum(r.reward for r in results) / n, 4),
        "calls_per_episode": round(sum(r.num_calls for r in results) / n, 4),
        "episodes": len(results),
        "prompt_versions": sorted({r.prompt_version or "" for r in results}),
    }


async def optimize_prompt(
    cfg: OptimizeConfig, rollouts: Rollouts, say: Say, tick: Tick | None = None
) -> dict[str, Any]:
    """Run the whole optimisation on a started stack reached through ``rollouts``; returns the report."""
    t0 = time.perf_counter()
    shutil.rmtree(cfg.out / "gepa", ignore_errors=True)  # GEPA resumes from a run_dir it finds: start fresh
    if not cfg.train or not cfg.val:
        raise OptimizeError("optimize needs at least one train and one validation task")
    original = cfg.original
    if original is None:
        original = await rollouts.detect_original(cfg.train[0])
        say(f"the agent's system prompt, read from a recorded call: {original[:120]!r}")
    rollouts.components = [ComponentSpec(cfg.component, original, cfg.match)]
    seed: Candidate = {cfg.component: cfg.seed_prompt if cfg.seed_prompt is not None else original}
    lm = ReflectionLM(cfg.reflection_url, cfg.reflection_model, api_key=cfg.reflection_api_key)
    loop = asyncio.get_running_loop()
    used = [0]

    def on_evaluated(_version: str, results: list[EpisodeResult]) -> None:
        used[0] += len(results)
        if tick is not None:
            tick(min(used[0], cfg.max_metric_calls), cfg.max_metric_calls)

    adapter = FlywheelAdapter(rollouts, loop, on_evaluated=on_evaluated)
    say(
        f"GEPA: {len(cfg.train)} train / {len(cfg.val)} validation tasks, budget {cfg.max_metric_calls} "
        f"episodes or {cfg.max_seconds:.0f}s, reflection {cfg.reflection_model} at {cfg.reflection_url}"
    )

    gepa_log = _QuietLogger()

    def run_gepa() -> Any:
        return optimize(
            seed_candidate=seed,
            trainset=cfg.train,
            valset=cfg.val,
            adapter=adapter,
            reflection_lm=lm,
            max_metric_calls=cfg.max_metric_calls,
            stop_callbacks=[TimeoutStopCondition(cfg.max_seconds)],
            reflection_minibatch_size=cfg.minibatch,
            candidate_selection_strategy="pareto",
            acceptance_criterion="improvement_or_equal" if cfg.accept == "equal" else "strict_improvement",
            run_dir=str(cfg.out / "gepa"),
            seed=cfg.seed,
            display_progress_bar=False,
            logger=gepa_log,
        )

    try:
        result = await asyncio.to_thread(run_gepa)
    finally:
        lm.close()
        cfg.out.mkdir(parents=True, exist_ok=True)
        (cfg.out / "gepa_log.txt").write_text("\n".join(gepa_log.lines) + "\n")
    gepa_seconds = time.perf_counter() - t0
    best: Candidate = dict(result.best_candidate)
    versions = [prompt_version_of(dict(c)) for c in result.candidates]
    say(
        f"GEPA done: {len(result.candidates)} candidates, {result.total_metric_calls} episodes, "
        f"best validation score {result.val_aggregate_scores[result.best_idx]:.3f} (candidate {result.best_idx})"
    )
    held_out = await _held_out(cfg.test, rollouts, seed, best, say) if cfg.test else None
    activated = None
    if cfg.activate:
        activated = await rollouts.activate(best, reason="flywheel optimize --activate")
        say(f"activated prompt version {activated} at the gateway")
    else:
        await rollouts.activate(None, reason="flywheel optimize: done, the agent's own prompts again")
    report: dict[str, Any] = {
        "component": {"name": cfg.component, "match": cfg.match, "original": original},
        "seed": {"prompt_version": versions[0], "text": seed[cfg.component]},
        "best": {
            "index": result.best_idx,
            "prompt_version": versions[result.best_idx],
            "text": best[cfg.component],
            "val_score": result.val_aggregate_scores[result.best_idx],
        },
        **_lineage(result, versions, cfg),
        "held_out": held_out,
        "episodes": {"gepa": result.total_metric_calls, "all": rollouts.episodes_run},
        "budget": {"max_metric_calls": cfg.max_metric_calls, "max_seconds": cfg.max_seconds},
        "tasks": {"train": len(cfg.train), "val": len(cfg.val), "test": len(cfg.test)},
        "reflection": {"url": cfg.reflection_url, "model": cfg.reflection_model, "calls": lm.calls},
        "evaluations": adapter.evaluations,
        "activated": activated,
        "gepa_seconds": round(gepa_seconds, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_outputs(cfg.out, report)
    return report


async def _held_out(
    test: list[Task], rollouts: Rollouts, seed: Candidate, best: Candidate, say: Say
) -> dict[str, Any]:
    """The seed and the winner on tasks GEPA never saw."""
    say(f"held-out check: seed and winner on {len(test)} unseen tasks")
    await rollouts.activate(seed)
    before = _summary(await rollouts.run(test))
    await rollouts.activate(best)
    after = _summary(await rollouts.run(test))
    say(f"held-out success: seed {100 * before['success']:.1f}% → winner {100 * after['success']:.1f}%")
    return {
        "seed": before,
        "best": after,
        "success_points": round(100.0 * (after["success"] - before["success"]), 2),
    }


def _lineage(result: GEPAResult[Any, Any], versions: list[str], cfg: OptimizeConfig) -> dict[str, Any]:
    """The report's ``candidates`` (each with its parents and score) and ``pareto_frontier``."""
    frontier = sorted({i for front in result.per_val_instance_best_candidates.values() for i in front})
    return {
        "candidates": [
            {
                "index": i,
                "prompt_version": versions[i],
                "text": dict(c)[cfg.component],
                "parents": [p for p in result.parents[i] if p is not None],
                "val_score": result.val_aggregate_scores[i],
                "discovered_at_episode": result.discovery_eval_counts[i],
                "on_frontier": i in frontier,
            }
            for i, c in enumerate(result.candidates)
        ],
        "pareto_frontier": {
            "candidates": frontier,
            "per_val_task": {
                cfg.val[int(k)].task_id if isinstance(k, int) and k < len(cfg.val) else str(k): sorted(v)
                for k, v in result.per_val_instance_best_candidates.items()
            },
        },
    }


class _QuietLogger:
    """GEPA's per-iteration log lines are kept (written to ``gepa_log.txt``); the CLI shows a progress bar."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def write_outputs(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "best_prompt.txt").write_text(report["best"]["text"])
    plot(out / "val_scores.png", report)


def plot(path: Path, report: dict[str, Any]) -> None:
    """Validation score per candidate, with lines from each parent (lineage); frontier marked."""
    # lazy, and in this order: the Agg backend must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = report["candidates"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in cands:
        for p in c["parents"]:
            ax.plot([p, c["index"]], [cands[p]["val_score"], c["val_score"]], color="0.7", lw=1, zorder=1)
    xs = [c["index"] for c in cands]
    ys = [c["val_score"] for c in cands]
    colors = ["tab:orange" if c["on_frontier"] else "tab:blue" for c in cands]
    ax.scatter(xs, ys, c=colors, zorder=2)
    best = report["best"]["index"]
    ax.annotate("best", (best, cands[best]["val_score"]), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("candidate (in order of discovery; lines: parent → child)")
    ax.set_ylabel("validation score (mean reward)")
    ax.set_title("flywheel optimize: GEPA candidates (orange: on the Pareto frontier)")
    ax.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
