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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from examples.demo import production, replaying, roles
from examples.demo.agents import CALC_REF, DemoAgent, demo_agent
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
    replay_from: Path | None = None  # replay: the recorded ``flywheel demo --out`` directory
    replay: replaying.ReplayOptions = field(default_factory=replaying.ReplayOptions)
    # replay: the checkpoints' validation tasks (held out, not the report's); None: half of eval_tasks
    validation_tasks: int | None = None
    agent: str = "calc"  # which demo agent (examples/demo/agents.py); ``warm`` is its recipe
    curriculum: float | None = None  # rollouts: the signal curriculum's revisit probability (None: off)
    engine: Literal["embedded", "vllm"] = "embedded"  # vllm: a real vLLM serves the policy (_vllm_server)
    # an agent with roles: a LoRA adapter per role ("writer,rewriter") or one shared ("shared") over the
    # frozen warm start (examples/demo/roles.py); "": the whole model, fully fine-tuned
    policies: str = ""


Say = Callable[[str], None]


def stack_settings(
    cfg: DemoConfig, data_dir: Path, trainer_dir: Path, agent: DemoAgent | None = None
) -> StackSettings:
    algo = AlgorithmConfig(
        learning_rate=cfg.learning_rate,
        max_staleness=4,
        stale_policy="drop",
        reference_kl=cfg.source == "replay",  # the replay's per-step KL from the warm start (its report)
    )
    # A production session is a group of one: a step takes as many sessions as the training demo's
    # step takes episodes (B × G), so both train on batches of the same size.
    per_step = cfg.batch_groups * cfg.group_size if cfg.source == "production" else cfg.batch_groups
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
    t0 = time.perf_counter()
    seed_dir = cfg.out / f"seed-{cfg.seed}"
    trainer_dir = seed_dir / "trainer"
    shutil.rmtree(trainer_dir, ignore_errors=True)  # a demo starts fresh, never resumes an old run
    recorded: replaying.RecordedRun | None = None
    loaded = replaying.LoadedEpisodes([])
    data_dir = cfg.out / "data"
    if cfg.source == "replay":
        if cfg.replay_from is None:
            raise replaying.RecordedRunError("--source replay needs --from <a recorded demo run's --out>")
        recorded = replaying.recorded_run(cfg.replay_from, cfg.seed)
        say(f"[seed {cfg.seed}] reading the recorded run's episodes from {recorded.chdb}")
        loaded = await asyncio.to_thread(replaying.load_episodes, recorded, data_dir)
    agent = demo_agent(cfg.agent, cfg.cache)
    if cfg.agent != "calc" and (cfg.source != "rollouts" or cfg.optimize is not None):
        # production users, replayed runs and the prompt stage are written for the calculator's tasks
        raise ValueError(f"agent {cfg.agent!r} runs with source 'rollouts' only, without a prompt stage")
    policies = roles.role_policies(agent, cfg.policies) if cfg.policies else None
    if policies is not None and (cfg.baseline or cfg.engine != "embedded"):
        # the SFT-only baseline replaces the whole model; vLLM would need LoRA enabled at its launch
        raise roles.RolePoliciesError("--policies runs on the embedded engine, without --baseline")
    warm_cfg = WarmStartConfig(**{**cfg.warm.__dict__, "seed": cfg.seed})
    say(f"[seed {cfg.seed}] warm start (cache {cfg.cache / warm_cfg.key()})")
    warm_dir, warm_s = await asyncio.to_thread(warm_start, warm_cfg, cfg.cache, say, cfg.gate)
    say(f"[seed {cfg.seed}] warm start ready in {warm_s:.0f}s: {warm_dir}")
    heldout = agent.heldout(warm_cfg, cfg.eval_tasks)
    by_model = bool(agent.train_models)  # a selective agent: report trained vs context calls per model
    # One event-log directory per process (chdb's rule): every seed of this run records into it.
    settings = stack_settings(cfg, data_dir, trainer_dir, agent)
    lora: dict[str, Any] | None = None
    if policies is not None:  # adapters over the frozen warm start, at the rate the command line gave
        settings, lora = roles.with_adapters(settings, policies, cfg.learning_rate)
    fixed = await _fixed_models(agent, cfg, warm_dir, seed_dir, say)
    if fixed is not None:
        routes = ",".join(f"{name}=embedded+{fixed.url}/v1" for name in agent.fixed_models)
        settings = settings.replace(gateway_model_routes=routes)
    rollouts: dict[str, Any] = {}
    if cfg.source == "rollouts":
        rollouts = {
            "tasks": agent.rl_tasks(warm_cfg),
            "agent": agent.ref,
            "group_size": cfg.group_size,
            "curriculum_revisit": cfg.curriculum,
        }
    key = production.create_key(data_dir) if cfg.source == "production" else ""
    vllm = await _vllm_server(cfg, warm_dir, seed_dir, settings.model, say) if cfg.engine == "vllm" else None
    stack = EmbeddedStack(settings, model_dir=warm_dir, vllm_url=vllm.url if vllm else None, **rollouts)
    try:
        await stack.start()
    except BaseException:
        if fixed is not None:
            await fixed.stop()
        if vllm is not None:
            await asyncio.to_thread(vllm.stop)
        raise
    assert stack.bus is not None and stack.trainer is not None
    report: dict[str, Any] = {"seed": cfg.seed, "source": cfg.source, "engine": cfg.engine}
    if cfg.agent != "calc":
        report["agent"] = cfg.agent
        report.update(roles.report_fields(policies, lora))
    if fixed is not None:
        report["fixed_models"] = {name: fixed.url for name in agent.fixed_models}
    try:
        say(
            f"[seed {cfg.seed}] stack up, gateway {stack.gateway_url}; evaluating {len(heldout)} held-out tasks"
        )
        if cfg.optimize is not None:  # stage 1: the prompt, from a poor one; RL then runs under the winner
            say(f"[seed {cfg.seed}] prompt optimisation (GEPA) from {cfg.optimize.seed_prompt!r}")
            report["prompt_optimization"] = await optimize_stage(
                cfg.optimize, stack.bus, agent.ref, heldout, seed_dir / "optimize", cfg.seed, say
            )
        before = await evaluate(stack.bus, heldout, agent.ref, by_model=by_model)
        say(f"[seed {cfg.seed}] before: {_fmt(before)}")
        monitor = TrainingMonitor(stack.bus, on_step=on_step)
        await monitor.start()
        # an agent with roles: each role's calls by adapter, and each policy's updates
        ledger = Ledger(stack.bus, by=model_of) if by_model else None
        if ledger is not None:
            await ledger.start()
        since = datetime.now(UTC)
        if cfg.source == "production":
            phase = await production.production_phase(
                stack,
                key,
                seed=cfg.seed,
                users=cfg.users,
                mistake_rate=cfg.user_mistake_rate,
                rl_seconds=cfg.rl_seconds,
                max_steps=cfg.max_steps,
                say=say,
            )
        elif recorded is not None:
            # validation tasks: the next held-out tasks after the report's (disjoint from them)
            n_val = cfg.validation_tasks or max(1, cfg.eval_tasks // 2)
            validation = agent.heldout(warm_cfg, cfg.eval_tasks + n_val)[cfg.eval_tasks :]
            assert stack.bus is not None
            bus = stack.bus
            phase = await replaying.replay_phase(
                stack,
                recorded,
                loaded,
                rl_seconds=cfg.rl_seconds,
                max_steps=cfg.max_steps,
                say=say,
                steps_seen=lambda: [p.metrics for p in monitor.points],
                batch_groups=cfg.batch_groups,
                validate=lambda: evaluate(bus, validation, agent.ref),
                warm_weights=warm_dir,
                work_dir=seed_dir / "replay",
                options=cfg.replay,
            )
        else:
            phase = await _rollouts_phase(stack, cfg)
        rl_seconds = float(phase.pop("rl_seconds"))
        until = datetime.now(UTC)
        await monitor.stop()
        if ledger is not None:
            await ledger.stop()
            report.update(roles.update_figures(ledger, policies, warm_dir))
        say(f"[seed {cfg.seed}] trained {len(monitor.points)} steps in {rl_seconds:.0f}s")
        after = await evaluate(stack.bus, heldout, agent.ref, by_model=by_model)
        say(f"[seed {cfg.seed}] after:  {_fmt(after)}")
        # The RL run: stack, evaluations and RL, from the warm start on. Building the warm start happens
        # once per machine (it is cached outside the repo) and is reported as warm_start_seconds.
        rl_run_seconds = time.perf_counter() - t0 - warm_s
        baseline: EvalResult | None = None
        baseline_steps = 0
        if cfg.baseline:
            seconds = rl_seconds if cfg.baseline_seconds is None else cfg.baseline_seconds
            say(f"[seed {cfg.seed}] SFT-only baseline: {seconds:.0f}s of SFT from the warm start")
            base_dir, baseline_steps = await asyncio.to_thread(
                sft_only_baseline, warm_cfg, warm_dir, seed_dir / "sft_only_baseline", seconds, say, agent
            )
            await _serve(stack, base_dir)
            baseline = await evaluate(stack.bus, heldout, agent.ref, by_model=by_model)
            say(f"[seed {cfg.seed}] SFT-only baseline: {_fmt(baseline)}")
        report.update(
            {
                "before": before.as_dict(),
                "after": after.as_dict(),
                "sft_only_baseline": baseline.as_dict() if baseline else None,
                "delta": _delta(before, after),
                "rl_seconds": round(rl_seconds, 1),
                "rl_run_seconds": round(rl_run_seconds, 1),
                "rl_window": {"since": since.isoformat(), "until": until.isoformat()},
                # with adapters a point is one adapter's update; a step may update several
                "rl_steps": stack.trainer.step if policies is not None else len(monitor.points),
                "rl_batches_without_signal": stack.trainer.batches_without_signal,
                "rl_groups_received": len(stack.trainer.intake.consumed),
                "trainer_samples": stack.trainer.status().samples,
                "trainer_skipped": dict(stack.trainer.intake.skipped),
                "trainer_stale_dropped": replaying.stale_counts(stack.trainer),
                **phase,
                "baseline_sft_steps": baseline_steps,
                "warm_start_seconds": round(warm_s, 1),
                "warm_start_dir": str(warm_dir),
                "warm_start_gate": gate_record(warm_cfg, cfg.gate, cfg.cache),
                "heldout_tasks": len(heldout),
                "recorded_events": stack.recorder.stats.events if stack.recorder else 0,
                "points": monitor.points,
            }
        )
        planner = stack.trainer.planner
        if planner is not None and planner.curriculum is not None:
            report["curriculum"] = {"revisit": cfg.curriculum, **planner.curriculum.stats.as_dict()}
    finally:
        await stack.stop()
        if fixed is not None:
            await fixed.stop()
        if vllm is not None:
            await asyncio.to_thread(vllm.stop)
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return report


async def _vllm_server(cfg: DemoConfig, warm_dir: Path, seed_dir: Path, name: str, say: Say) -> VllmServer:
    """vLLM on the warm start for this seed's run (2-4 minutes to start on 2 cores), its context the
    model's own (the demo's model has 512 positions; vLLM refuses a longer ``max_model_len``)."""
    import json
    import socket

    from infra.engine.vllm_server import VllmLaunch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])

    positions = json.loads((warm_dir / "config.json").read_text()).get("max_position_embeddings", 2048)
    launch = VllmLaunch(
        model=warm_dir, served_model_name=name, port=port, max_model_len=min(int(positions), 2048)
    )
    say(f"[seed {cfg.seed}] starting vLLM on the warm start (log {seed_dir / 'vllm.log'})")
    await asyncio.to_thread(seed_dir.mkdir, parents=True, exist_ok=True)
    server = await asyncio.to_thread(VllmServer.start, launch, log_path=seed_dir / "vllm.log")
    say(f"[seed {cfg.seed}] vLLM serving at {server.url}")
    return server


async def _fixed_models(
    agent: DemoAgent, cfg: DemoConfig, warm_dir: Path, seed_dir: Path, say: Say
) -> EngineProcess | None:
    """A second engine serving the warm start, frozen, for the agent's fixed roles (None: it has none).
    The gateway routes those roles' model names to it; the trainer's weight updates never reach it."""
    if not agent.fixed_models:
        return None
    if not cfg.engine_process:
        raise ValueError(f"the {agent.name} demo's fixed roles need engine_process (their own engine)")
    await asyncio.to_thread(seed_dir.mkdir, parents=True, exist_ok=True)
    fixed = await EngineProcess.start(
        warm_dir,
        log_path=seed_dir / "fixed-engine.log",
        model_name=agent.fixed_models[0],
        max_num_seqs=max(64, cfg.batch_groups * cfg.group_size),
        threads=cfg.threads or None,
    )
    say(f"[seed {cfg.seed}] fixed roles {', '.join(agent.fixed_models)}: the warm start at {fixed.url}")
    return fixed


async def _rollouts_phase(stack: EmbeddedStack, cfg: DemoConfig) -> dict[str, Any]:
    """The trainer requests its own episode groups for ``cfg.rl_seconds``."""
    t_rl = time.perf_counter()
    training = stack.start_training(cfg.max_steps)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(training), cfg.rl_seconds)
    await stack.stop_training()
    rl_seconds = time.perf_counter() - t_rl
    return {"rl_seconds": rl_seconds, "rollouts_cancelled": stack.cancel_rollouts()}


async def _serve(stack: EmbeddedStack, model_dir: Path) -> None:
    """Serve ``model_dir``'s weights as the next version, through the weight-update protocol."""
    import torch
    from safetensors.torch import load_file

    from trainer.weights import WeightUpdate

    assert stack.trainer is not None
    state: dict[str, torch.Tensor] = load_file(str(model_dir / "model.safetensors"))
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    version = stack.trainer.weights.serving_version + 1
    # The state for an in-process engine, the directory for one behind HTTP (``engine_process``).
    result = await stack.trainer.weights.update(WeightUpdate(version, lambda: state, model_dir))
    if not result.activated:
        raise RuntimeError(f"could not serve the SFT-only baseline (version {version})")


def _fmt(r: EvalResult) -> str:
    return (
        f"success {100 * r.success:.1f}%  transitions/episode {r.transitions_per_episode:.2f} "
        f"(merged trajectories {r.trajectories_per_episode:.2f})  "
        f"({r.episodes} episodes, {r.errors} errors, {r.seconds:.0f}s)"
    )
