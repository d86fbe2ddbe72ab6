"""``flywheel up``: the whole embedded stack in one process, with a live status panel.

Gateway, engine, worker, reward service, recorder and trainer run on the in-process bus
(:class:`flywheel.stack.EmbeddedStack`, which builds each part with ``flywheel.assembly``; this
command chooses the engine: the embedded one, ``--vllm URL`` or ``--engine vllm``). The gateway's port also serves the admin API — the gateway's
own routes, the event log's (``/admin/eventlog``) and the ops routes (``/admin/ops/status``,
``/admin/ops/replay``) — so ``flywheel status|query|replay|export --url URL`` work against it from
another terminal. Ctrl-C (or SIGTERM) stops the parts newest first: the trainer finishes its step,
the recorder writes what it holds, nothing is lost.

Stopping is bounded in every state (starting, serving, stopping): the first Ctrl-C starts a clean
stop that must end within ``STOP_DEADLINE_S``; past it the process prints every thread's stack and
exits (``faulthandler``'s watchdog runs in C, so it fires even if Python itself were wedged). A
second Ctrl-C stops the process at once: after the first, SIGINT is back to the system's default.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import signal
import socket
import sys
from itertools import cycle
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from flywheel.assembly import TINY_CACHE, TINY_CORPUS, tiny_model
from flywheel.cli.common import fail, refuse_exposure, usage
from flywheel.cli.vllm_options import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_TOOL_CALL_PARSER,
    MaxModelLen,
    ToolCallParser,
    tool_call_parser,
)
from flywheel.ops.api import OpsContext, create_ops_router
from flywheel.stack import EmbeddedStack, StackError, StackSettings
from flywheel.taskfile import TaskFileError, guess_agent_kind, load_task_file
from flywheel.ui.app import SignIn, create_ui_router
from flywheel.ui.auth import SessionStore
from infra.eventlog.errors import EventLogUnavailableError
from infra.logging import configure_logging
from schemas import AgentRef

__all__ = ["TINY_CACHE", "TINY_CORPUS", "register", "up_command"]  # the toy model lives in the builder

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rich.console import RenderableType

    from infra.engine.vllm_server import VllmLaunch
    from infra.eventlog.models import EpisodeFilter
    from schemas import EpisodeScored

STOP_DEADLINE_S = 30.0  # a clean stop (trainer step, recorder flush, chdb close) ends within this


class _NoEventLog:
    """Replay's source when the stack records nothing (FLYWHEEL_RECORD_EVENTS=false)."""

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]:

        raise EventLogUnavailableError("this stack records no events (FLYWHEEL_RECORD_EVENTS=false)")


def _services(stack: EmbeddedStack) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    out["gateway"] = {"up": bool(stack.gateway_url), "url": stack.gateway_url}
    if stack.engine is not None:
        out["engine"] = {
            "up": True,
            "weight_version": stack.engine.weight_version,
            "running": stack.engine.num_running,
            "waiting": stack.engine.num_waiting,
        }
    else:
        out["engine"] = {"up": False}
    out["worker"] = {"up": stack.worker is not None}
    if stack.reward is not None:
        out["reward"] = {"up": True, "scored": stack.reward.stats.scored}
    else:
        out["reward"] = {"up": False}
    if stack.recorder is not None:
        out["recorder"] = {"up": True, "events": stack.recorder.stats.events}
    if stack.trainer is not None:
        out["trainer"] = {"up": True, "step": stack.trainer.step, "version": stack.trainer.backend.version}
    return out


def _gateway_state(stack: EmbeddedStack) -> dict[str, Any] | None:
    app = stack.gateway_app
    gateway = getattr(app.state, "gateway", None) if app is not None else None
    state = gateway.state() if gateway is not None else None
    return dict(state) if isinstance(state, dict) else None


def _panel(report: dict[str, Any], url: str) -> RenderableType:

    services = Table("service", "up", "detail", expand=True)
    for name, info in report["services"].items():
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("up", "url"))
        services.add_row(name, "[green]●[/green]" if info.get("up") else "[red]●[/red]", detail)
    topics = Table("topic", "consumer lag", expand=True)
    for topic, groups in report["topics"].items():
        topics.add_row(topic, ", ".join(f"{g}={n}" for g, n in groups.items()) or "-")
    c, g = report["control"], report.get("gateway") or {}
    summary = (
        f"weights v{c.get('weight_version') if c.get('weight_version') is not None else g.get('weight_version', 0)}"
        f" · trainer step {c.get('trainer_step') or 0}"
        f" · gateway paused={g.get('paused')} in_flight={g.get('in_flight')} spool={g.get('spool_depth')}"
    )
    header = (
        f"OpenAI base URL for agents: {url}/v1 · admin: flywheel status --url {url} · web view: {url}/ui/"
    )
    return Panel(
        Group(header, summary, services, topics), title="flywheel up", subtitle="Ctrl-C stops cleanly"
    )


async def _run(stack: EmbeddedStack, train: bool, max_steps: int | None) -> int:

    console = Console()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            return
        stop.set()
        # Bounded from here on, whatever happens to this process's threads (see the module docstring).
        faulthandler.dump_traceback_later(STOP_DEADLINE_S, exit=True, file=sys.stderr)
        if sig is signal.SIGINT:
            loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # the second Ctrl-C ends the process at once
        console.print(f"flywheel up: stopping (at most {STOP_DEADLINE_S:g} s; Ctrl-C again to quit now)")

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    # Starting can take a while (a model to load): a Ctrl-C meanwhile stops what has started so far.
    starting = asyncio.create_task(stack.start(ready=False))  # ready once the ops routes are mounted
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await stack.stop()
        console.print("flywheel up: stopped while starting")
        return 0
    stopped.cancel()
    starting.result()  # a StackError is the caller's to print
    ctx: OpsContext | None = None
    try:
        if stack.bus is None or stack.gateway_app is None:
            raise RuntimeError("the embedded stack started without a bus or a gateway")
        ctx = OpsContext(
            bus=stack.bus,
            reader=stack.store if stack.store is not None else _NoEventLog(),
            admin_token=stack.settings.admin_token.get_secret_value(),
            services=lambda: _services(stack),
            gateway_state=lambda: _gateway_state(stack),
        )
        await ctx.watch_control()
        stack.gateway_app.include_router(create_ops_router(ctx))
        if stack.store is not None:  # the web view (flywheel/ui) on the same port, under /ui
            settings = stack.settings
            sessions = SessionStore(idle_s=settings.ui_session_idle_s, max_s=settings.ui_session_max_s)
            sign_in = SignIn(sessions, bound_host=settings.gateway.gateway_host)
            stack.gateway_app.include_router(create_ui_router(stack.store, ctx.admin_token, sign_in=sign_in))
        stack.ready()
        training = stack.start_training(max_steps) if train and stack.trainer is not None else None
        url = stack.gateway_url
        console.print(f"flywheel up: gateway and admin API on {url} (data in {stack.settings.data_dir})")
        if stack.store is not None:
            console.print(f"flywheel up: web view on {url}/ui/ (sign in with FLYWHEEL_ADMIN_TOKEN)")
        if console.is_terminal:
            with Live(console=console, refresh_per_second=2, transient=False) as live:
                while not stop.is_set():
                    live.update(_panel((await ctx.status()).as_dict(), url))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
        else:
            await stop.wait()
        if training is not None and training.done() and not training.cancelled() and training.exception():
            console.print(f"trainer failed: {training.exception()!r}")
    finally:
        if ctx is not None:
            await ctx.stop()
        await stack.stop()
    events = stack.recorder.stats.events if stack.recorder is not None else 0
    console.print(f"flywheel up: stopped cleanly ({events} events recorded)")
    return 0


def up_command(
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Hugging Face model directory to serve and train (the policy)."),
    ] = None,
    tiny: Annotated[
        bool, typer.Option("--tiny", help="Build and use a toy model (a few MB) to try things out.")
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Gateway + admin port (0: any free).")
    ] = 8100,
    host: Annotated[str, typer.Option("--host", help="Interface for the gateway.")] = "127.0.0.1",
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Default FLYWHEEL_DATA_DIR.")] = None,
    tasks: Annotated[
        Path | None,
        typer.Option("--tasks", help="JSONL tasks: the trainer requests rollouts of them itself."),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Agent for --tasks: command line or module:function.")
    ] = None,
    n: Annotated[int, typer.Option("--n", min=2, help="Episodes per task (GRPO group size).")] = 8,
    no_trainer: Annotated[
        bool, typer.Option("--no-trainer", help="Serve and record only; do not train.")
    ] = False,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Stop training after N steps.")
    ] = None,
    vllm: Annotated[
        str | None,
        typer.Option(
            "--vllm",
            help="Serve and train through this running vLLM (dev mode, serving --model as `policy`): "
            "each new version is reloaded into it.",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="embedded (Flywheel's engine) or vllm (start a vLLM server on --model from its own "
            "environment: infra/scripts/vllm_env.sh).",
        ),
    ] = "embedded",
    max_model_len: MaxModelLen = None,
    tool_parser: ToolCallParser = None,
) -> None:
    """Run the whole embedded stack (gateway, engine, worker, reward, recorder, trainer) in one process."""
    if (tasks is None) != (agent is None):
        usage("--tasks and --agent go together")
    if model is None and not tiny:
        usage("give --model DIR (a Hugging Face model directory) or --tiny for a toy model")
    if model is not None and not (model / "config.json").is_file():
        usage(f"{model} is not a Hugging Face model directory (no config.json)")
    if engine not in ("embedded", "vllm"):
        usage(f"--engine is embedded or vllm, not {engine}")
    if vllm is not None and engine == "vllm":
        usage("--vllm names a running server; --engine vllm starts one: give one of them")
    if (vllm is not None or engine == "vllm") and model is None:
        usage("--vllm and --engine vllm need --model DIR (the weights vLLM serves and the trainer trains)")
    if (max_model_len is not None or tool_parser is not None) and engine != "vllm":
        usage("--max-model-len and --tool-call-parser are how --engine vllm starts vLLM; give --engine vllm")
    parser = tool_call_parser(tool_parser)
    overrides: dict[str, Any] = {"gateway_port": port, "gateway_host": host, "run_trainer": not no_trainer}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    try:
        settings = StackSettings(**overrides)
    except ValidationError as exc:
        fail(str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, "))
    refuse_exposure(host, settings.admin_token.get_secret_value())
    configure_logging("WARNING", settings.log_json)
    if model is None:
        model = tiny_model()
    task_iter, agent_ref = None, None
    if tasks is not None and agent is not None:
        task_iter, agent_ref = _tasks_and_agent(tasks, agent)
    context = max_model_len or DEFAULT_MAX_MODEL_LEN
    with _vllm_server(model, settings, engine == "vllm", context, parser) as started:
        stack = EmbeddedStack(
            settings,
            model_dir=model,
            tasks=task_iter,
            agent=agent_ref,
            group_size=n,
            vllm_url=vllm or started,
        )
        try:
            code = asyncio.run(_run(stack, train=not no_trainer, max_steps=max_steps))
        except StackError as exc:
            fail(str(exc))
    raise typer.Exit(code)


def vllm_launch(
    model: Path,
    settings: Any,
    port: int,
    *,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    tool_call_parser: str | None = DEFAULT_TOOL_CALL_PARSER,
) -> VllmLaunch:
    """How ``--engine vllm`` starts vLLM for the stack's ``settings``: ``model`` served as the stack's
    model name, with ``--max-model-len`` and ``--tool-call-parser`` (``None``: no tool parsing); with a
    policy map, LoRA enabled (runtime loading allowed), up to the adapters' rank."""
    # lazy: infra.engine's package imports torch, which `flywheel up --help` must not wait for
    from infra.engine.vllm_server import VllmLaunch

    return VllmLaunch(
        model=model.resolve(),
        served_model_name=settings.model,
        port=port,
        max_model_len=max_model_len,
        tool_call_parser=tool_call_parser,
        enable_lora=bool(settings.policies),
        max_lora_rank=max(16, settings.trainer.trainer_lora.rank),
    )


@contextlib.contextmanager
def _vllm_server(
    model: Path, settings: Any, start: bool, max_model_len: int, tool_call_parser: str | None
) -> Iterator[str | None]:
    """``--engine vllm``: a vLLM server on ``model`` (served as the stack's model name) for the stack's
    lifetime, on a free loopback port; its log is ``<data_dir>/vllm.log``. With a policy map
    (``FLYWHEEL_POLICIES``) it serves LoRA adapters, loadable at runtime, up to the adapters' rank."""
    if not start:
        yield None
        return

    # lazy: infra.engine's package imports torch, which `flywheel up --help` must not wait for
    from infra.engine.vllm_server import VllmServer, VllmServerError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log_path = settings.data_dir / "vllm.log"
    typer.echo(f"starting vLLM on {model} (2-4 minutes on a CPU); log: {log_path}", err=True)
    try:
        server = VllmServer.start(
            vllm_launch(
                model, settings, port, max_model_len=max_model_len, tool_call_parser=tool_call_parser
            ),
            log_path=log_path,
        )
    except VllmServerError as exc:
        fail(str(exc))
    try:
        yield server.url
    finally:
        server.stop()


def _tasks_and_agent(path: Path, agent: str) -> tuple[Any, Any]:
    try:
        parsed = load_task_file(path)
    except TaskFileError as exc:
        usage(str(exc))
    return cycle(parsed), AgentRef(kind=guess_agent_kind(agent), spec=agent)


def register(app: typer.Typer) -> None:
    app.command("up")(up_command)
