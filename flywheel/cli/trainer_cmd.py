"""``flywheel trainer run|pause|resume|status`` and ``flywheel weights ls``.

Pause and resume travel one way: ``TrainerPauseRequested`` / ``TrainerResumeRequested`` on
``flywheel.control``. On Kafka the command publishes them itself; a running embedded stack (``flywheel
up``) publishes them on its in-process bus when asked through its admin API (``--url``, or
``FLYWHEEL_ADMIN_URL``). A paused trainer finishes its step in progress, keeps buffering episodes, takes
no step until resumed, and stays paused across a restart. ``status`` reads ``status.json`` (written by
the trainer every step and on every pause or resume) and, on Kafka, the latest ``TrainerStepCompleted``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from flywheel.alone import serve_trainer
from flywheel.cli.common import ADMIN_URL_HELP, admin_url, fail, load_settings, register_ls, run_service
from flywheel.ops.admin import AdminClient, AdminError
from infra.bus.base import BusError, Message
from infra.bus.factory import make_bus
from infra.logging import configure_logging
from schemas import CONTROL, TrainerPauseRequested, TrainerResumeRequested, TrainerStepCompleted
from trainer.checkpoints import CheckpointStore
from trainer.settings import TrainerSettings
from trainer.status import STATUS_FILE, TrainerStatus

Dir = Annotated[
    Path | None, typer.Option("--dir", help="Trainer directory (default: FLYWHEEL_DATA_DIR/trainer).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
Url = Annotated[str | None, typer.Option("--url", help=ADMIN_URL_HELP)]


def _settings(directory: Path | None) -> TrainerSettings:

    settings = TrainerSettings()
    if directory is not None:
        settings = settings.model_copy(update={"trainer_dir": directory})
    return settings


def _request_pause(pause: bool, reason: str, url: str | None) -> tuple[str, dict[str, Any]]:
    """Publish TrainerPauseRequested / TrainerResumeRequested on the control topic: through a running
    stack's admin API when given its URL, else on Kafka. Returns where it went and the event published;
    fails in one line."""
    settings = load_settings()
    model = _settings(None).model
    target = admin_url(url)
    if target:
        client = AdminClient(target, settings.admin_token.get_secret_value(), timeout_s=15)
        action = "pause" if pause else "resume"
        try:
            published = asyncio.run(
                client.post(f"/admin/ops/trainer/{action}", {"model": model, "reason": reason})
            )
        except AdminError as exc:
            fail(str(exc))
        return target, dict(published)
    if settings.bus != "kafka":
        fail(
            "the embedded stack's bus lives in the `flywheel up` process: pass --url (it prints its admin "
            "URL) or set FLYWHEEL_BUS=kafka for a distributed deployment"
        )
    event = (
        TrainerPauseRequested(model=model, reason=reason, producer="cli")
        if pause
        else TrainerResumeRequested(model=model, producer="cli")
    )

    async def _go() -> None:
        bus = make_bus(settings)
        try:
            async with asyncio.timeout(15):
                await bus.start()
                await bus.publish(CONTROL, event)
        finally:
            await bus.stop()

    try:
        asyncio.run(_go())
    except (BusError, OSError, TimeoutError) as exc:
        fail(f"Kafka at {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}")
    return f"Kafka at {settings.kafka_bootstrap}", event.model_dump(mode="json")


def _latest_step_on_bus(settings: TrainerSettings, wait_s: float = 3.0) -> dict[str, Any] | None:
    latest: list[TrainerStepCompleted] = []

    async def _go() -> None:
        bus = make_bus(settings)
        await bus.start()

        async def on(msg: Message) -> None:
            if isinstance(msg.event, TrainerStepCompleted) and msg.event.model == settings.model:
                latest[:] = [msg.event]

        group = f"cli-status-{uuid.uuid4().hex[:8]}"
        try:
            sub = await bus.subscribe(CONTROL, group, on, from_beginning=True)
            # read what the topic holds: done when this group has committed all of it (at most wait_s)
            for _ in range(max(1, round(wait_s / 0.05))):
                if await bus.lag(CONTROL, group) == 0:
                    break
                await asyncio.sleep(0.05)
            await sub.stop()
        finally:
            await bus.stop()

    try:
        asyncio.run(_go())
    except (BusError, OSError) as exc:
        typer.echo(f"warning: could not read the bus ({type(exc).__name__}: {exc})", err=True)
        return None
    if not latest:
        return None
    e = latest[0]
    return {
        "step": e.step,
        "version": e.version,
        "metrics": e.metrics.as_dict(),
        "samples": {str(k): v for k, v in e.samples.items()},
        "at": e.emitted_at.isoformat(),
    }


def run_command(
    model: Annotated[
        Path | None, typer.Option("--model", help="Hugging Face model directory to train.")
    ] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="sync | async")] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(
            "--algorithm",
            help="grpo (group-relative, critic-free; the default) | ppo (a value head and GAE).",
        ),
    ] = None,
    objective: Annotated[
        str | None, typer.Option("--objective", help="rl | sft (cross-entropy on successes).")
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", help="Stop after this many steps (default: run until Ctrl-C)."),
    ] = None,
    directory: Dir = None,
    dp: Annotated[
        int | None,
        typer.Option(
            "--dp",
            help="Data-parallel ranks: torch processes on this host, or with --backend verl on the CPU a Ray worker group of N (docs/engines.md).",
        ),
    ] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="torch | verl (verl: the `verl` extra, GPUs)")
    ] = None,
) -> None:
    """Consume scored episodes and train (Ctrl-C stops after the step in progress)."""
    settings = _settings(directory)
    update: dict[str, Any] = {}
    if model is not None:
        update["trainer_base_model"] = model
    if mode is not None:
        if mode not in ("sync", "async"):
            typer.echo("error: --mode must be sync or async", err=True)
            raise typer.Exit(2)
        update["trainer_mode"] = mode
    if algorithm is not None:
        if algorithm not in ("grpo", "ppo"):
            typer.echo("error: --algorithm must be grpo or ppo", err=True)
            raise typer.Exit(2)
        update["trainer_algo"] = settings.trainer_algo.model_copy(update={"algorithm": algorithm})
    if objective is not None:
        if objective not in ("rl", "sft"):
            typer.echo("error: --objective must be rl or sft", err=True)
            raise typer.Exit(2)
        update["trainer_objective"] = objective
    if dp is not None:
        if dp < 1:
            typer.echo("error: --dp must be at least 1", err=True)
            raise typer.Exit(2)
        update["trainer_dp"] = dp
    if backend is not None:
        if backend not in ("torch", "verl"):
            typer.echo("error: --backend must be torch or verl", err=True)
            raise typer.Exit(2)
        update["trainer_backend"] = backend
    settings = settings.model_copy(update=update)
    if settings.trainer_base_model is None or not (settings.trainer_base_model / "config.json").is_file():
        typer.echo("error: --model must name a Hugging Face model directory (with config.json)", err=True)
        raise typer.Exit(2)
    configure_logging(settings.log_level, settings.log_json)
    run_service(serve_trainer(settings, max_steps))


def _requested(action: str, via: str, event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"requested": action, "via": via, "event": event}, default=str))
    else:
        typer.echo(f"trainer {action} requested ({via})")


def pause_command(
    reason: Annotated[str, typer.Option("--reason", help="Why, recorded with the pause.")] = "operator",
    url: Url = None,
    as_json: AsJson = False,
) -> None:
    """Stop taking training steps after the one in progress (until `flywheel trainer resume`)."""
    if not reason.strip() or len(reason) > 1024:
        fail("--reason must be 1 to 1024 characters", 2)
    _requested("pause", *_request_pause(True, reason, url), as_json)


def resume_command(url: Url = None, as_json: AsJson = False) -> None:
    """Take training steps again."""
    _requested("resume", *_request_pause(False, "", url), as_json)


def status_command(as_json: AsJson = False, directory: Dir = None) -> None:
    """Step, version, paused, and the last step's metrics."""
    settings = _settings(directory)
    path = settings.trainer_root / STATUS_FILE
    status: TrainerStatus | None = None
    if path.exists():
        try:
            status = TrainerStatus.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            typer.echo(f"error: cannot read {path}: {exc}".splitlines()[0], err=True)
            raise typer.Exit(1) from exc
    on_bus = _latest_step_on_bus(settings) if settings.bus == "kafka" else None
    if status is None and not on_bus:
        typer.echo(f"no trainer status yet ({path} missing and no TrainerStepCompleted seen)", err=True)
        raise typer.Exit(1)
    if as_json:
        report: dict[str, Any] = status.model_dump(mode="json") if status is not None else {}
        if settings.bus == "kafka":
            report["last_step_on_bus"] = on_bus
        typer.echo(json.dumps(report, default=str))
        return
    if status is None:
        typer.echo(f"no status file yet; last step on the bus: {json.dumps(on_bus, default=str)}")
        return
    typer.echo(
        f"step {status.step}  version {status.version}  serving {status.serving_version}  "
        f"mode {status.mode}  paused {status.paused}"
        + (f" ({status.pause_reason})" if status.paused and status.pause_reason else "")
    )
    for name, version in status.adapters.items():
        typer.echo(f"  adapter {name:<16} version {version}  serving {status.serving_adapters.get(name, 0)}")
    if status.samples:
        typer.echo("  samples trained         " + "  ".join(f"{k} {v}" for k, v in status.samples.items()))
    for key in ("reward", "success", "transitions_per_episode", "staleness_mean", "kl", "tokens_per_s"):
        value = status.metrics.get(key)
        if value is not None:
            typer.echo(f"  {key:<24} {value:.4g}")


def ls_command(as_json: AsJson = False, directory: Dir = None) -> None:
    """List saved weight versions (newest last); with a policy map, each adapter's (``policy``)."""
    root = _settings(directory).trainer_root
    store = CheckpointStore(root)
    adapters = sorted(p for p in (root / "policies").glob("*") if p.is_dir())
    # with adapters the shared checkpoints hold no weights (step, offsets): each adapter's are listed
    stores = [(p.name, CheckpointStore(p)) for p in adapters] if adapters else [(None, store)]
    rows: list[dict[str, Any]] = []
    for policy, each in stores:
        latest = each.latest()
        rows += [
            {
                "version": i.meta.version,
                "step": i.meta.step,
                "created_at": i.meta.created_at,
                "path": str(i.path),
                "latest": latest is not None and latest.path == i.path,
                "reward": i.meta.metrics.get("reward"),
                "policy": policy,
            }
            for i in each.all()
        ]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"no checkpoints under {store.dir}")
        return
    for r in rows:
        mark = "*" if r["latest"] else " "
        reward = "" if r["reward"] is None else f"  reward {r['reward']:.3f}"
        policy = f"{r['policy']:<12} " if r["policy"] is not None else ""
        typer.echo(
            f"{mark} {policy}v{r['version']:<6} step {r['step']:<6} {r['created_at']}  {r['path']}{reward}"
        )


def register(app: typer.Typer) -> None:
    trainer = typer.Typer(help="Run and control the trainer.", no_args_is_help=True)
    weights = typer.Typer(help="Weight versions (checkpoints).", no_args_is_help=True)
    app.add_typer(trainer, name="trainer")
    app.add_typer(weights, name="weights")
    trainer.command("run")(run_command)
    trainer.command("pause")(pause_command)
    trainer.command("resume")(resume_command)
    trainer.command("status")(status_command)
    register_ls(weights, ls_command)
