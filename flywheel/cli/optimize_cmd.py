"""``flywheel optimize``: optimise the agent's prompt with GEPA on real rollouts, with no change to the agent.

The embedded stack (engine serving ``--model-dir``, gateway, rollout worker, reward service, event
log; no trainer) runs the agent on every task of every evaluation; the gateway substitutes each
candidate for the agent's own prompt. See ``flywheel/optimize/run.py`` for the steps and the outputs.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flywheel.cli.common import fail, usage
from flywheel.optimize.rollouts import OptimizeError, Rollouts
from flywheel.optimize.run import OptimizeConfig, optimize_prompt
from flywheel.optimize.tasks import TaskFileError, load_tasks, split, tasks_from_eventlog
from flywheel.stack import EmbeddedStack, StackError, StackSettings
from infra.eventlog.errors import EventLogError
from infra.eventlog.store import open_store
from infra.logging import configure_logging
from schemas import AgentKind, AgentRef, Task


def register(app: typer.Typer) -> None:
    app.command("optimize")(optimize)


def _read(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        usage(f"{what}: no file at {path}")
    text = path.read_text()
    if not text.strip():
        usage(f"{what}: {path} is empty")
    return text.strip()


def optimize(
    model_dir: Annotated[
        Path, typer.Option(help="the policy the engine serves (a Hugging Face model directory)")
    ],
    reflection_url: Annotated[str, typer.Option(help="OpenAI-compatible base URL of the reflection model")],
    reflection_model: Annotated[str, typer.Option(help="the reflection model's name at that endpoint")],
    tasks: Annotated[Path | None, typer.Option(help="JSONL task file (one schemas.Task per line)")] = None,
    from_eventlog: Annotated[
        Path | None, typer.Option(help="take the tasks of past episodes from this chdb event-log directory")
    ] = None,
    test_tasks: Annotated[
        Path | None, typer.Option(help="held-out tasks (JSONL); default: --test tasks cut from --tasks")
    ] = None,
    train: Annotated[int, typer.Option(min=1, help="train tasks (GEPA's reflection minibatches)")] = 20,
    val: Annotated[int, typer.Option(min=1, help="validation tasks (GEPA's Pareto frontier)")] = 20,
    test: Annotated[
        int, typer.Option(min=0, help="held-out tasks cut from --tasks (ignored with --test-tasks)")
    ] = 0,
    agent: Annotated[str, typer.Option(help="the agent: module:function (callable) or a command line")] = (
        "examples.demo_agents.calc_agent.agent:run"
    ),
    agent_kind: Annotated[str, typer.Option(help="callable | command")] = "callable",
    component: Annotated[str, typer.Option(help="the component's name")] = "system_prompt",
    match: Annotated[
        str, typer.Option(help="system (the system message, by its text) | span (a marked span)")
    ] = ("system"),
    original_prompt: Annotated[
        Path | None, typer.Option(help="the agent's text to replace (default: read from a probe rollout)")
    ] = None,
    seed_prompt: Annotated[
        Path | None, typer.Option(help="the text GEPA starts from (default: the original)")
    ] = None,
    reflection_api_key: Annotated[
        str, typer.Option(envvar="FLYWHEEL_REFLECTION_API_KEY", help="API key of the reflection endpoint")
    ] = "",
    max_metric_calls: Annotated[int, typer.Option(min=1, help="budget: episodes GEPA may run")] = 200,
    minutes: Annotated[float, typer.Option(min=0.1, help="budget: wall-clock minutes of GEPA")] = 5.0,
    minibatch: Annotated[int, typer.Option(min=1, help="tasks per reflection minibatch")] = 4,
    seed: Annotated[int, typer.Option(help="shuffling and GEPA's sampling")] = 0,
    accept: Annotated[
        str,
        typer.Option(
            help="keep a proposal that beats its parent on the minibatch (strict) or ties it (equal)"
        ),
    ] = "strict",
    activate: Annotated[
        bool, typer.Option(help="make the winner the gateway's active prompt version")
    ] = False,
    out: Annotated[Path, typer.Option(help="report.json, val_scores.png, best_prompt.txt")] = Path(
        ".flywheel/optimize"
    ),
    threads: Annotated[int, typer.Option(min=0, help="torch threads of the engine (0: torch's default)")] = 1,
) -> None:
    """Optimise the agent's prompt with GEPA, every evaluation a real rollout through the stack."""
    _check_options(match, accept, agent_kind, tasks, from_eventlog, model_dir, reflection_url)
    configure_logging("WARNING", None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    tr, va, te = _split_tasks(tasks, from_eventlog, test_tasks, train, val, test, seed)
    try:
        report = asyncio.run(
            _run(
                model_dir,
                agent,
                agent_kind,
                threads,
                dict(
                    out=out,
                    train=tr,
                    val=va,
                    test=te,
                    component=component,
                    match=match,
                    original=_read(original_prompt, "--original-prompt"),
                    seed_prompt=_read(seed_prompt, "--seed-prompt"),
                    reflection_url=reflection_url,
                    reflection_model=reflection_model,
                    reflection_api_key=reflection_api_key,
                    max_metric_calls=max_metric_calls,
                    max_seconds=minutes * 60.0,
                    minibatch=minibatch,
                    seed=seed,
                    accept=accept,
                    activate=activate,
                ),
            )
        )
    except OptimizeError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    _print_summary(report, out)


def _check_options(
    match: str,
    accept: str,
    agent_kind: str,
    tasks: Path | None,
    from_eventlog: Path | None,
    model_dir: Path,
    reflection_url: str,
) -> None:
    if match not in ("system", "span"):
        usage(f"--match must be system or span, not {match!r}")
    if accept not in ("strict", "equal"):
        usage(f"--accept must be strict or equal, not {accept!r}")
    if agent_kind not in ("callable", "command"):
        usage(f"--agent-kind must be callable or command, not {agent_kind!r}")
    if (tasks is None) == (from_eventlog is None):
        usage("give exactly one of --tasks FILE and --from-eventlog DIR")
    if not (model_dir / "config.json").is_file():
        usage(f"--model-dir {model_dir} is not a model directory (no config.json)")
    if not reflection_url.startswith(("http://", "https://")):
        usage(f"--reflection-url must be an http(s) URL, not {reflection_url!r}")


def _split_tasks(
    tasks: Path | None,
    from_eventlog: Path | None,
    test_tasks: Path | None,
    train: int,
    val: int,
    test: int,
    seed: int,
) -> tuple[list[Task], list[Task], list[Task]]:
    """Train, validation and held-out tasks; held-out ones from ``--test-tasks`` never repeat a train or
    validation task."""
    try:
        pool = load_tasks(tasks) if tasks is not None else _eventlog_tasks(from_eventlog, train + val + test)
        held = load_tasks(test_tasks) if test_tasks is not None else None
        tr, va, te = split(pool, train=train, val=val, test=0 if held is not None else test, seed=seed)
    except TaskFileError as exc:
        usage(str(exc))
    if held is not None:
        seen = {t.task_id for t in tr + va}
        te = [t for t in held if t.task_id not in seen]
    return tr, va, te


def _print_summary(report: dict[str, Any], out: Path) -> None:
    typer.echo(
        f"best: candidate {report['best']['index']} ({report['best']['prompt_version']}), validation score "
        f"{report['best']['val_score']:.3f}; {len(report['candidates'])} candidates, "
        f"{report['episodes']['all']} episodes in {report['seconds']:.0f}s"
    )
    if report["held_out"]:
        h = report["held_out"]
        typer.echo(
            f"held-out success: seed {100 * h['seed']['success']:.1f}% -> best {100 * h['best']['success']:.1f}% "
            f"({h['success_points']:+.1f} points on {h['best']['episodes']} tasks)"
        )
    typer.echo(
        f"report: {out / 'report.json'}  plot: {out / 'val_scores.png'}  prompt: {out / 'best_prompt.txt'}"
    )


def _eventlog_tasks(path: Path | None, limit: int) -> list[Task]:

    if path is None:
        usage("give --tasks FILE or --from-eventlog DIR")
    try:
        store = open_store(chdb_path=path)
    except (EventLogError, OSError) as exc:
        fail(f"cannot open the event log at {path}: {exc}")
    try:
        return tasks_from_eventlog(store, limit)
    finally:
        store.close()


async def _run(
    model_dir: Path, agent: str, agent_kind: str, threads: int, fields: dict[str, Any]
) -> dict[str, Any]:
    cfg = OptimizeConfig(**fields)
    settings = StackSettings(
        data_dir=cfg.out / "data",
        run_trainer=False,
        engine_threads=threads,
        concurrency=64,
        engine_max_num_seqs=64,
    )
    stack = EmbeddedStack(settings, model_dir=model_dir)
    try:
        await stack.start()
    except StackError as exc:
        raise OptimizeError(str(exc)) from exc
    assert stack.bus is not None
    console = Console(stderr=True)
    rollouts = Rollouts(stack.bus, AgentRef(kind=AgentKind(agent_kind), spec=agent), model=settings.model)
    await rollouts.start()
    try:
        with Progress(
            TextColumn("[bold]optimize[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            bar = progress.add_task("episodes", total=cfg.max_metric_calls)
            return await optimize_prompt(
                cfg,
                rollouts,
                say=lambda m: progress.console.print(m),
                tick=lambda used, total: progress.update(bar, completed=used, total=total),
            )
    finally:
        await rollouts.stop()
        await stack.stop()
