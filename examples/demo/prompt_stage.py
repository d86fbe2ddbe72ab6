"""``flywheel demo --optimize-prompt``: a prompt-optimisation stage before RL, on the same running stack.

The agent starts from a deliberately poor system prompt (``seed_prompt``, substituted by the gateway:
the agent's code is unchanged). ``flywheel optimize``'s loop (flywheel/optimize/run.py) runs GEPA over
real rollouts on RL-split tasks and checks seed and winner on the demo's held-out tasks; the winner is
then activated at the gateway, so the held-out evaluations before and after RL and every RL group are
served under it (a group is pinned to one prompt version: gateway/prompts.py). The report holds both
stages on the same held-out tasks: seed prompt → optimised prompt, then optimised prompt → after RL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.demo_agents.calc_agent import tasks as calc_tasks
from flywheel.optimize.rollouts import Rollouts
from flywheel.optimize.run import OptimizeConfig, optimize_prompt
from infra.bus.base import Bus
from schemas import AgentRef, Task

# The calculator agent's protocol is CALC:/ANSWER:; this seed never mentions it.
POOR_PROMPT = "You are a helpful assistant. Answer the user's question."


@dataclass(frozen=True)
class PromptStageConfig:
    reflection_url: str
    reflection_model: str
    seed_prompt: str = POOR_PROMPT
    train: int = 16
    val: int = 24
    max_metric_calls: int = 160
    max_seconds: float = 180.0
    minibatch: int = 4


async def optimize_stage(
    cfg: PromptStageConfig,
    bus: Bus,
    agent: AgentRef,
    heldout: Sequence[Task],
    out: Path,
    seed: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Optimise the agent's system prompt from ``cfg.seed_prompt`` and leave the winner active."""
    pool = [Task.model_validate(t) for t in calc_tasks.sample("rl", 30_000 + seed, cfg.train + cfg.val)]
    rollouts = Rollouts(bus, agent)
    await rollouts.start()
    try:
        report = await optimize_prompt(
            OptimizeConfig(
                out=out,
                train=pool[: cfg.train],
                val=pool[cfg.train :],
                test=list(heldout),
                seed_prompt=cfg.seed_prompt,
                reflection_url=cfg.reflection_url,
                reflection_model=cfg.reflection_model,
                max_metric_calls=cfg.max_metric_calls,
                max_seconds=cfg.max_seconds,
                minibatch=cfg.minibatch,
                seed=seed,
                activate=True,
            ),
            rollouts,
            say,
        )
    finally:
        await rollouts.stop()
    return {
        "seed_prompt": report["seed"],
        "best_prompt": report["best"],
        "held_out": report["held_out"],
        "candidates": len(report["candidates"]),
        "episodes": report["episodes"],
        "seconds": report["seconds"],
        "report": str(out / "report.json"),
    }
