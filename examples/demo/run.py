"""``flywheel demo``, one seed top-down: warm start → held-out eval → RL → eval → SFT-only baseline.

Everything after the warm start runs through the embedded stack (``flywheel.stack.EmbeddedStack``): the
demo's agent (``DemoConfig.agent``, :mod:`examples.demo.agents`: the calculator agent of
``examples/demo_agents/calc_agent``, plain ``openai`` code, or the LangGraph SQL agent of ``examples/demo_agents/sql_agent``) is
run by the rollout worker, its calls go through the gateway to the embedded engine and onto the bus, the
reward service scores the episodes (training only the calls the agent's ``train_models`` selects), the
trainer consumes the groups it asked for and pushes every new weight version into the engine with the
weight-update protocol. The held-out tasks share no problem (SQL: no database) with the SFT or RL tasks.

The SFT-only baseline gets the same wall-clock seconds as the RL phase, spent on more SFT over the same
teacher demonstrations, and is served and evaluated through the same pipeline.

Where the RL phase's data comes from is ``DemoConfig.source``:

* ``rollouts``: the trainer requests episode groups (``RolloutRequested``) and trains on them (GRPO);
* ``production``: no rollouts are requested; simulated users (:mod:`examples.demo.production`) use the
  deployed agent through a tenant key and rate its answers, and the trainer learns from those sessions;
* ``replay``: no rollouts either; a recorded demo run's episodes are replayed from its event log
  (:mod:`examples.demo.replaying`) into a fresh copy of the same warm start.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from examples.demo import gating, pretrained, production, replaying, roles
from examples.demo.agents import CALC_REF, DemoAgent, demo_agent
from examples.demo.engines import serve_weights, start_fixed_engine, start_vllm, stop_engines
from examples.demo.figures import trainer_figures
from examples.demo.ledger import Ledger, model_of
from examples.demo.pipeline import EvalResult, StepPoint, TrainingMonitor, evaluate
from examples.demo.prompt_stage import PromptStageConfig, optimize_stage
from examples.demo.warmstart import (
    DEFAULT_CACHE,
    GateConfig,
    WarmStartConfig,
    gate_record,
    sft_only_baseline,
    warm_start,
)
from flywheel.stack import EmbeddedStack, StackSettings
from infra.engine.process import EngineProcess
from infra.engine.vllm_server import VllmServer
from schemas import Task
from trainer.config import AlgorithmConfig

AGENT = CALC_REF  # the calculator agent (``DemoConfig.agent`` picks another)

Source = Literal["rollouts", "production", "replay"]


@dataclass
class DemoConfig:
    out: Path
    seed: int = 0
    rl_seconds: float = 420.0
    max_steps: int | None = None
    batch_groups: int = 8  # B tasks per step
    group_size: int = 8  # G episodes per task
    max_in_flight: int = 12  # K groups requested ahead (async)
    learning_rate: float = 2e-4  # `flywheel demo` passes the agent's (DemoAgent.learning_rate)
    eval_tasks: int = 512
    baseline: bool = True
    baseline_seconds: float | None = None  # None: the RL phase's wall-clock seconds (equal time)
    # torch threads of the engine and of the training process each (0: torch's default, every core).
    # One each: on 2 cores, seed 0 took 258 RL steps in 420 s, against 199 with both at two threads
    # (their thread pools wait for each other's cores) and 245 with training in a thread of this process.
    threads: int = 1
    engine_process: bool = (
        True  # its decode loop then never waits on this process's GIL (see infra/engine/process.py)
    )
    cache: Path = DEFAULT_CACHE
    warm: WarmStartConfig = field(default_factory=WarmStartConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    optimize: PromptStageConfig | None = None  # --optimize-prompt: a GEPA stage before RL
    source: Source = "rollouts"
    # production: simulated users at once, each one session after another. 64 = the episodes the
    # rollout worker runs at once in the training demo; a step trains batch_groups × group_size sessions.
    users: int = 64
    user_mistake_rate: float = 0.0  # share of sessions users rate the wrong way (examples/demo/production.py)
    feedback_delay: str = ""  # when users rate (production.FeedbackDelay's spec); "": at once
    recorded_source: str = ""  # replay: the source the recorded run trained from (its report's)
    recorded_steps: int = 0  # replay: the recorded run's steps, which the replay anneals its rate over
    # more AlgorithmConfig fields, for the comparisons on docs/replay.md (e.g. {"m2_threshold": None})
    algorithm: dict[str, Any] = field(default_factory=dict)
    replay_from: Path | None = None  # replay: the recorded ``flywheel demo --out`` directory
    replay: replaying.ReplayOptions = field(default_factory=replaying.ReplayOptions)
    # replay: the checkpoints' validation tasks (held out, not the report's); None: half of eval_tasks
    validation_tasks: int | None = None
    agent: str = "calc"  # which demo agent (examples/demo/agents.py); ``warm`` is its recipe
    curriculum: float | None = None  # rollouts: the signal curriculum's revisit probability (None: off)
    engine: Literal["embedded", "vllm"] = "embedded"  # vllm: a real vLLM serves the policy (start_vllm)
    # an agent with roles: a LoRA adapter per role ("writer,rewriter") or one shared ("shared") over the
    # frozen warm start (examples/demo/roles.py); "": the whole model, fully fine-tuned
    policies: str = ""
    gates: bool = False  # --gates: releases gated on validation tasks (examples/demo/gating.py)
    release_every: int = 10  # --gates: the trainer proposes a candidate every this many versions
    # the tenants' users like a right answer in their form ("right") or judge the form alone ("form")
    users_rule: Literal["right", "form"] = "right"
    # "smollm2": SmolLM2-135M-Instruct on BFCL through vLLM (examples/demo/pretrained.py), no warm start
    model: Literal["tiny", "smollm2"] = "tiny"
    vllm_url: str = ""  # --model smollm2: a running vLLM to use ("": start one)


Say = Callable[[str], None]


def stack_settings(
    cfg: DemoConfig, data_dir: Path, trainer_dir: Path, agent: DemoAgent | None = None
) -> StackSettings:
    replay = cfg.source == "replay"
    decay = min(cfg.max_steps or cfg.recorded_steps, cfg.recorded_steps) if replay else 0
    algo = AlgorithmConfig.model_validate(
        {
            "learning_rate": cfg.learning_rate,
            "reference_kl": replay,  # the replay's per-step KL from the warm start (its report)
            # a whole recorded run: negative samples tapered by their whole response's ratio, which kept
            # a 544-step replay from falling after its peak (docs/replay.md)
            **({"behaviour_weight": "tapered_sequence"} if replay else {}),
            # a replay's length is known: its learning rate anneals over it (docs/replay.md)
            **({"lr_decay_steps": decay} if decay else {}),
            **cfg.algorithm,
        }
    )
    # A production session is a group of one: a step takes as many sessions as the training demo's
    # step takes episodes (B × G), so both train on batches of the same size.
    per_step = (
        cfg.batch_groups * cfg.group_size
        if "production" in (cfg.source, cfg.recorded_source)
        else cfg.batch_groups
    )
    return StackSettings(
        data_dir=data_dir,
        trainer_dir=trainer_dir,
        trainer_mode="async",
        trainer_batch_groups=per_step,
        # replay: the recorded run's last groups train as a smaller batch instead of waiting forever
        trainer_batch_timeout_s=5.0 if cfg.source == "replay" else None,
        trainer_max_in_flight=max(cfg.max_in_flight, per_step),
        trainer_checkpoint_every=1_000_000,  # the demo keeps nothing but its report
        trainer_group_timeout_s=300.0,
        trainer_algo=algo,
        concurrency=max(64, cfg.batch_groups * cfg.group_size),
        engine_max_num_seqs=max(64, cfg.batch_groups * cfg.group_size, cfg.users),
        engine_threads=cfg.threads,
        engine_process=cfg.engine_process,
        train_models=agent.train_models if agent is not None else "",
        # late raters: the demo's users open ~45 sessions a second, so sessions rated four minutes late
        # are ~11,000 back; the reward service must still hold them to re-score (docs/usage.md)
        feedback_retain=100_000 if cfg.feedback_delay else 10_000,
    )


def _delta(before: EvalResult, after: EvalResult) -> dict[str, float]:
    return {
        "success_points": round(100.0 * (after.success - before.success), 2),
        "transitions_per_episode": round(after.transitions_per_episode - before.transitions_per_episode, 4),
        "calls_per_episode": round(after.calls_per_episode - before.calls_per_episode, 4),
    }


async def run_seed(
    cfg: DemoConfig, say: Say, on_step: Callable[[StepPoint], None] | None = None
) -> dict[str, Any]:
    """One full demo for ``cfg.seed``; returns its report (points under ``"points"``, not JSON)."""
    if cfg.model == "smollm2":
        settings = stack_settings(cfg, cfg.out / "data", cfg.out / f"seed-{cfg.seed}" / "trainer")
        return await pretrained.run_seed(cfg, settings, say, on_step)
    t0 = time.perf_counter()
    seed_dir = cfg.out / f"seed-{cfg.seed}"
    trainer_dir = seed_dir / "trainer"
    shutil.rmtree(trainer_dir, ignore_errors=True)  # a demo starts fresh, never resumes an old run
    data_dir = cfg.out / "data"
    recorded, loaded = await _recorded_episodes(cfg, data_dir, say)
    if recorded is not None:  # a production recording replays as sessions, B × G of them a step
        source, steps = (
            str(recorded.report.get("source", "rollouts")),
            int(recorded.report.get("rl_steps") or 0),
        )
        cfg = replace(cfg, recorded_source=source, recorded_steps=steps)
    agent = demo_agent(cfg.agent, cfg.cache)
    policies = _role_policies(cfg, agent)
    warm_cfg = WarmStartConfig(**{**cfg.warm.__dict__, "seed": cfg.seed})
    say(f"[seed {cfg.seed}] warm start (cache {cfg.cache / warm_cfg.key()})")
    warm_dir, warm_s = await asyncio.to_thread(warm_start, warm_cfg, cfg.cache, say, cfg.gate)
    say(f"[seed {cfg.seed}] warm start ready in {warm_s:.0f}s: {warm_dir}")
    seed = _Seed(cfg, agent, warm_cfg, warm_dir, seed_dir, agent.heldout(warm_cfg, cfg.eval_tasks), say)
    by_model = bool(agent.train_models)  # a selective agent: report trained vs context calls per model
    key = production.create_key(data_dir) if cfg.source == "production" else ""
    stack, lora, fixed, vllm = await _start_stack(seed, policies, data_dir, trainer_dir)
    assert stack.bus is not None and stack.trainer is not None
    report: dict[str, Any] = {"seed": cfg.seed, "source": cfg.source, "engine": cfg.engine}
    if cfg.algorithm:  # --algo: the trainer's knobs this run set
        report["algorithm"] = cfg.algorithm
    if cfg.agent != "calc":
        report["agent"] = cfg.agent
        report.update(roles.report_fields(policies, lora))
    if fixed is not None:
        report["fixed_models"] = {name: fixed.url for name in agent.fixed_models}
    try:
        say(
            f"[seed {cfg.seed}] stack up, gateway {stack.gateway_url}; evaluating {len(seed.heldout)} held-out tasks"
        )
        if cfg.optimize is not None:  # stage 1: the prompt, from a poor one; RL then runs under the winner
            say(f"[seed {cfg.seed}] prompt optimisation (GEPA) from {cfg.optimize.seed_prompt!r}")
            report["prompt_optimization"] = await optimize_stage(
                cfg.optimize, stack.bus, agent.ref, seed.heldout, seed_dir / "optimize", cfg.seed, say
            )
        before = await evaluate(stack.bus, seed.heldout, agent.ref, by_model=by_model)
        say(f"[seed {cfg.seed}] before: {_fmt(before)}")
        monitor = TrainingMonitor(stack.bus, on_step=on_step)
        await monitor.start()
        watch = await gating.ReleaseWatch.started(stack.bus, stack.settings.model) if cfg.gates else None
        # an agent with roles: each role's calls by adapter, and each policy's updates
        ledger = Ledger(stack.bus, by=model_of) if by_model else None
        if ledger is not None:
            await ledger.start()
        since = datetime.now(UTC)
        phase = await _rl_phase(stack, seed, monitor, key, recorded, loaded)
        rl_seconds = float(phase.pop("rl_seconds"))
        until = datetime.now(UTC)
        await monitor.stop()
        if ledger is not None:
            await ledger.stop()
            report.update(roles.update_figures(ledger, policies, warm_dir))
        say(f"[seed {cfg.seed}] trained {len(monitor.points)} steps in {rl_seconds:.0f}s")
        after = await evaluate(stack.bus, seed.heldout, agent.ref, by_model=by_model)
        say(f"[seed {cfg.seed}] after:  {_fmt(after)}")
        if watch is not None:  # --gates: the served versions' held-out success beside the latest's
            report.update(await gating.whole_model_report(stack.bus, watch, seed.heldout, agent.ref, say))
            await watch.stop()
        # The RL run: stack, evaluations and RL, from the warm start on. Building the warm start happens
        # once per machine (it is cached outside the repo) and is reported as warm_start_seconds.
        rl_run_seconds = time.perf_counter() - t0 - warm_s
        baseline, baseline_steps = await _sft_baseline(stack, seed, rl_seconds, by_model)
        report.update(
            {
                "before": before.as_dict(),
                "after": after.as_dict(),
                "sft_only_baseline": baseline.as_dict() if baseline else None,
                "delta": _delta(before, after),
                "rl_seconds": round(rl_seconds, 1),
                "rl_run_seconds": round(rl_run_seconds, 1),
                "rl_window": {"since": since.isoformat(), "until": until.isoformat()},
                **trainer_figures(stack, monitor, adapters=policies is not None),
                **phase,
                "baseline_sft_steps": baseline_steps,
                "warm_start_seconds": round(warm_s, 1),
                "warm_start_dir": str(warm_dir),
                "warm_start_gate": gate_record(warm_cfg, cfg.gate, cfg.cache),
                "heldout_tasks": len(seed.heldout),
                "recorded_events": stack.recorder.stats.events if stack.recorder else 0,
                "points": monitor.points,
            }
        )
        planner = stack.trainer.planner
        if planner is not None and planner.curriculum is not None:
            report["curriculum"] = {"revisit": cfg.curriculum, **planner.curriculum.stats.as_dict()}
    finally:
        await stack.stop()
        await stop_engines(fixed, vllm)
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return report


@dataclass(frozen=True)
class _Seed:
    """What one seed's phases share once its warm start is ready."""

    cfg: DemoConfig
    agent: DemoAgent
    warm_cfg: WarmStartConfig
    warm_dir: Path
    seed_dir: Path
    heldout: list[Task]
    say: Say


async def _start_stack(
    seed: _Seed, policies: roles.RolePolicies | None, data_dir: Path, trainer_dir: Path
) -> tuple[EmbeddedStack, dict[str, Any] | None, EngineProcess | None, VllmServer | None]:
    """The embedded stack on the warm start, with the engines beside it (the fixed roles' engine, vLLM),
    started; with the adapters' settings when the agent's roles train as LoRA adapters."""
    cfg, agent, warm_dir, seed_dir, say = seed.cfg, seed.agent, seed.warm_dir, seed.seed_dir, seed.say
    # One event-log directory per process (chdb's rule): every seed of this run records into it.
    settings = stack_settings(cfg, data_dir, trainer_dir, agent)
    lora: dict[str, Any] | None = None
    if policies is not None:  # adapters over the frozen warm start, at the rate the command line gave
        settings, lora = roles.with_adapters(settings, policies, cfg.learning_rate)
    # --gates: candidates pass gates on validation tasks the report never scores (examples/demo/gating.py)
    if cfg.gates:
        ids = {t.task_id for t in seed.heldout}
        validation = gating.validation_tasks(cfg.seed, cfg.validation_tasks or gating.VALIDATION_TASKS, ids)
        settings = gating.gated(settings, seed_dir / "gates", validation, cfg.release_every, agent.ref.spec)
    fixed = await start_fixed_engine(agent, cfg, warm_dir, seed_dir, say)
    if fixed is not None:
        routes = ",".join(f"{name}=embedded+{fixed.url}/v1" for name in agent.fixed_models)
        settings = settings.replace(gateway_model_routes=routes)
    rollouts: dict[str, Any] = {}
    if cfg.source == "rollouts":
        rollouts = {
            "tasks": agent.rl_tasks(seed.warm_cfg),
            "agent": agent.ref,
            "group_size": cfg.group_size,
            "curriculum_revisit": cfg.curriculum,
        }
    vllm = await start_vllm(cfg, warm_dir, seed_dir, settings.model, say) if cfg.engine == "vllm" else None
    stack = EmbeddedStack(settings, model_dir=warm_dir, vllm_url=vllm.url if vllm else None, **rollouts)
    try:
        await stack.start()
    except BaseException:
        await stop_engines(fixed, vllm)
        raise
    return stack, lora, fixed, vllm


async def _recorded_episodes(
    cfg: DemoConfig, data_dir: Path, say: Say
) -> tuple[replaying.RecordedRun | None, replaying.LoadedEpisodes]:
    """``--source replay``: the recorded run and its episodes, loaded into this run's event log."""
    if cfg.source != "replay":
        return None, replaying.LoadedEpisodes([])
    if cfg.replay_from is None:
        raise replaying.RecordedRunError("--source replay needs --from <a recorded demo run's --out>")
    recorded = replaying.recorded_run(cfg.replay_from, cfg.seed)
    say(f"[seed {cfg.seed}] reading the recorded run's episodes from {recorded.chdb}")
    return recorded, await asyncio.to_thread(replaying.load_episodes, recorded, data_dir)


def _role_policies(cfg: DemoConfig, agent: DemoAgent) -> roles.RolePolicies | None:
    if cfg.agent != "calc" and (cfg.source != "rollouts" or cfg.optimize is not None):
        # production users, replayed runs and the prompt stage are written for the calculator's tasks
        raise ValueError(f"agent {cfg.agent!r} runs with source 'rollouts' only, without a prompt stage")
    policies = roles.role_policies(agent, cfg.policies) if cfg.policies else None
    if policies is not None and (cfg.baseline or cfg.engine != "embedded"):
        # the SFT-only baseline replaces the whole model; vLLM would need LoRA enabled at its launch
        raise roles.RolePoliciesError("--policies runs on the embedded engine, without --baseline")
    return policies


async def _rl_phase(
    stack: EmbeddedStack,
    seed: _Seed,
    monitor: TrainingMonitor,
    key: str,
    recorded: replaying.RecordedRun | None,
    loaded: replaying.LoadedEpisodes,
) -> dict[str, Any]:
    """RL from the configured source: production users, a recorded run, or requested rollouts."""
    cfg = seed.cfg
    assert stack.bus is not None
    if cfg.source == "production":
        return await production.production_phase(
            stack,
            key,
            seed=cfg.seed,
            users=cfg.users,
            mistake_rate=cfg.user_mistake_rate,
            rl_seconds=cfg.rl_seconds,
            max_steps=cfg.max_steps,
            say=seed.say,
            feedback_delay=production.FeedbackDelay.parse(cfg.feedback_delay),
        )
    if recorded is None:
        return await _rollouts_phase(stack, cfg)
    # validation tasks: the next held-out tasks after the report's (disjoint from them)
    n_val = cfg.validation_tasks or max(1, cfg.eval_tasks // 2)
    validation = seed.agent.heldout(seed.warm_cfg, cfg.eval_tasks + n_val)[cfg.eval_tasks :]
    bus = stack.bus
    return await replaying.replay_phase(
        stack,
        recorded,
        loaded,
        rl_seconds=cfg.rl_seconds,
        max_steps=cfg.max_steps,
        say=seed.say,
        steps_seen=lambda: [p.metrics for p in monitor.points],
        batch_groups=cfg.batch_groups * cfg.group_size
        if cfg.recorded_source == "production"
        else cfg.batch_groups,
        validate=lambda: evaluate(bus, validation, seed.agent.ref),
        warm_weights=seed.warm_dir,
        work_dir=seed.seed_dir / "replay",
        options=cfg.replay,
    )


async def _sft_baseline(
    stack: EmbeddedStack, seed: _Seed, rl_seconds: float, by_model: bool
) -> tuple[EvalResult | None, int]:
    """``--baseline``: SFT alone from the warm start for as long as RL ran, served and evaluated; with
    the SFT steps it took (None, 0 without it)."""
    cfg, say = seed.cfg, seed.say
    if not cfg.baseline:
        return None, 0
    assert stack.bus is not None
    seconds = rl_seconds if cfg.baseline_seconds is None else cfg.baseline_seconds
    say(f"[seed {cfg.seed}] SFT-only baseline: {seconds:.0f}s of SFT from the warm start")
    base_dir, steps = await asyncio.to_thread(
        sft_only_baseline,
        seed.warm_cfg,
        seed.warm_dir,
        seed.seed_dir / "sft_only_baseline",
        seconds,
        say,
        seed.agent,
    )
    await serve_weights(stack, base_dir)
    baseline = await evaluate(stack.bus, seed.heldout, seed.agent.ref, by_model=by_model)
    say(f"[seed {cfg.seed}] SFT-only baseline: {_fmt(baseline)}")
    return baseline, steps


async def _rollouts_phase(stack: EmbeddedStack, cfg: DemoConfig) -> dict[str, Any]:
    """The trainer requests its own episode groups for ``cfg.rl_seconds``."""
    t_rl = time.perf_counter()
    training = stack.start_training(cfg.max_steps)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(training), cfg.rl_seconds)
    await stack.stop_training()
    rl_seconds = time.perf_counter() - t_rl
    return {"rl_seconds": rl_seconds, "rollouts_cancelled": stack.cancel_rollouts()}


def _fmt(r: EvalResult) -> str:
    return (
        f"success {100 * r.success:.1f}%  transitions/episode {r.transitions_per_episode:.2f} "
        f"(merged trajectories {r.trajectories_per_episode:.2f})  "
        f"({r.episodes} episodes, {r.errors} errors, {r.seconds:.0f}s)"
    )
