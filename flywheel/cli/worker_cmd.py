"""``flywheel worker``, ``flywheel reward`` and ``flywheel tasks submit``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from flywheel.alone import serve_reward, serve_worker
from flywheel.cli.common import EXIT_USAGE, JSON_HELP, run_service
from flywheel.cli.vllm_cmd import bfcl_command
from flywheel.taskfile import guess_agent_kind, read_task_file
from infra.bus.factory import make_bus
from infra.logging import configure_logging
from infra.settings import FlywheelSettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings
from schemas import AgentKind, AgentRef, Mode, RolloutRequested, tasks_topic

if TYPE_CHECKING:
    from schemas import Task

tasks_app = typer.Typer(help="Submit rollout tasks.", no_args_is_help=True)


def _agent_kind(spec: str, kind: str | None) -> str:
    """``--kind`` if given; else guessed from the spec (``flywheel.taskfile``)."""
    return kind or guess_agent_kind(spec).value


def worker_command(
    concurrency: Annotated[int | None, typer.Option(help="episodes run at once by this worker")] = None,
    pool: Annotated[str | None, typer.Option(help="consume flywheel.tasks.<pool>")] = None,
    gateway: Annotated[str | None, typer.Option(help="the gateway agents call (its base URL)")] = None,
) -> None:
    """Run a rollout worker: consume tasks, run agents, report episodes (until Ctrl-C)."""
    overrides: dict[str, object] = {}
    if concurrency is not None:
        overrides["concurrency"] = concurrency
    if pool is not None:
        overrides["pool"] = pool
    if gateway is not None:
        overrides["gateway_url"] = gateway
    settings = WorkerSettings(**overrides)  # type: ignore[arg-type]
    configure_logging(settings.log_level, settings.log_json)
    run_service(serve_worker(settings))


def reward_command(
    gateway: Annotated[str | None, typer.Option(help="the gateway the LLM judge calls")] = None,
    train_models: Annotated[
        str | None,
        typer.Option(help="only calls asking for these models (comma-separated) train; the rest is context"),
    ] = None,
) -> None:
    """Run the reward service: score finished episodes, publish transitions (until Ctrl-C)."""
    overrides: dict[str, str] = {"gateway_url": gateway} if gateway else {}
    if train_models is not None:
        overrides["train_models"] = train_models
    settings = RewardSettings(**overrides)  # type: ignore[arg-type]
    configure_logging(settings.log_level, settings.log_json)
    run_service(serve_reward(settings))


def submit_command(
    file: Annotated[Path, typer.Argument(help="JSONL: one task per line (task_id, input, answer, scorer)")],
    agent: Annotated[str, typer.Option(help="command line, module:function, or Job template path")],
    n: Annotated[int, typer.Option(help="rollouts per task (the GRPO group size)")] = 8,
    kind: Annotated[
        str | None, typer.Option(help="command | callable | kubernetes (default: guessed)")
    ] = None,
    deadline: Annotated[float, typer.Option(help="seconds per episode")] = 300.0,
    max_attempts: Annotated[int, typer.Option(help="attempts per rollout (retries on error/timeout)")] = 1,
    mode: Annotated[str, typer.Option(help="train | val")] = "train",
    model: Annotated[str, typer.Option(help="model name the agent asks for")] = "policy",
    pool: Annotated[str | None, typer.Option(help="publish to flywheel.tasks.<pool>")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Publish n RolloutRequested per task line; bad lines are reported and not published.

    Exit 0 all published; 1 nothing published (no valid line, the broker down); 2 bad options, a missing
    file, or some lines were bad (the rest published).
    """
    code = submit(
        file,
        agent=agent,
        kind=_agent_kind(agent, kind),
        n=n,
        deadline_s=deadline,
        max_attempts=max_attempts,
        mode=mode,
        model=model,
        pool=pool,
        as_json=as_json,
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
    app.command("reward")(reward_command)
    tasks_app.command("submit")(submit_command)
    tasks_app.command("bfcl")(bfcl_command)
    app.add_typer(tasks_app, name="tasks")


# ------------------------------------------------------------------------------ tasks submit


def _error(message: str) -> None:
    typer.echo(message, err=True)


def read_tasks(file: Path) -> tuple[list[Task], list[str]]:
    """Valid tasks and one message per bad line (``FILE:LINE: reason``)."""
    return read_task_file(file)


def build_requests(
    tasks: list[Task],
    *,
    agent: AgentRef,
    n: int,
    deadline_s: float,
    max_attempts: int,
    mode: Mode,
    model: str,
    pool: str | None,
) -> list[RolloutRequested]:

    return [
        request
        for task in tasks
        for request in RolloutRequested.group(
            task,
            agent,
            n,
            producer="flywheel-cli",
            max_attempts=max_attempts,
            mode=mode,
            model=model,
            deadline_s=deadline_s,
            pool=pool,
        )
    ]


async def _publish(settings: FlywheelSettings, topic: str, requests: list[RolloutRequested]) -> None:
    bus = make_bus(settings)
    await bus.start()
    try:
        await bus.ensure_topics([topic])
        # the bar goes to stderr: stdout holds only the result (one JSON document with --json)
        with Progress(console=Console(stderr=True), transient=False) as progress:
            bar = progress.add_task("publishing", total=len(requests))
            for chunk_start in range(0, len(requests), 64):
                chunk = requests[chunk_start : chunk_start + 64]
                await asyncio.gather(*(bus.publish(topic, r) for r in chunk))
                progress.advance(bar, len(chunk))
    finally:
        await bus.stop()


def submit(
    file: Path,
    *,
    agent: str,
    kind: str,
    n: int,
    deadline_s: float,
    max_attempts: int,
    mode: str,
    model: str,
    pool: str | None,
    as_json: bool = True,
) -> int:
    """Exit code: 0 all published; 1 nothing published (no valid line, no broker); 2 bad options, a
    missing file, or some lines were bad (the rest published)."""
    try:
        agent_ref = AgentRef(kind=AgentKind(kind), spec=agent)
        mode_value = Mode(mode)
        if not 1 <= n <= 4096 or deadline_s <= 0 or not 1 <= max_attempts <= 100:
            raise ValueError("need 1 ≤ --n ≤ 4096, --deadline > 0, 1 ≤ --max-attempts ≤ 100")
    except ValueError as exc:
        _error(f"error: {exc}")
        return EXIT_USAGE
    if not file.is_file():
        _error(f"error: {file} is not a file")
        return EXIT_USAGE
    try:
        tasks, errors = read_tasks(file)
    except ValueError as exc:  # TaskFileError: unreadable
        _error(f"error: {exc}")
        return 1
    for message in errors:
        _error(message)
    if not tasks:
        _error(f"error: no valid task in {file}; nothing published")
        return 1
    settings = FlywheelSettings()
    if settings.bus == "memory":
        _error(
            "error: the in-process bus lives inside `flywheel up`; set FLYWHEEL_BUS=kafka to submit from here"
        )
        return 1
    requests = build_requests(
        tasks,
        agent=agent_ref,
        n=n,
        deadline_s=deadline_s,
        max_attempts=max_attempts,
        mode=mode_value,
        model=model,
        pool=pool,
    )
    topic = tasks_topic(pool)
    try:
        asyncio.run(_publish(settings, topic, requests))
    except Exception as exc:  # the broker is down, a topic cannot be created, ...: one clear line
        _error(f"error: publishing to {topic} failed: {type(exc).__name__}: {exc}")
        return 1
    result = {
        "published": len(requests),
        "tasks": len(tasks),
        "groups": len(tasks),
        "bad_lines": len(errors),
        "topic": topic,
    }
    if as_json:
        typer.echo(json.dumps(result))
    else:
        bad = f"; {len(errors)} bad line(s) left out" if errors else ""
        typer.echo(f"published {len(requests)} rollout(s): {len(tasks)} task(s) × {n} to {topic}{bad}")
    return 2 if errors else 0
