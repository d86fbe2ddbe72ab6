"""``flywheel agl-server``: Agent Lightning 1.0's server API (``agl-server``) on Flywheel.

    flywheel agl-server --port 8080 --key K --model Qwen/Qwen2.5-7B-Instruct [--data-dir D]
                        [--upstream http://vllm:8000/v1] [--model-dir DIR | (toy model)]

Wires, in this process: the bus (in-process by default; Kafka with ``FLYWHEEL_BUS=kafka``), the
recorder writing every topic to the event log (embedded chdb under the data dir; on Kafka the
``flywheel recorder`` does it), the gateway's recording machinery, the default upstream (the
embedded engine on ``--model-dir``, a toy model without one, or ``--upstream``), the journal the AGL
state is rebuilt from on start, and the AGL app (``gateway/agl``) on ``--host:--port``. The event log
is readable at ``/admin/eventlog/...`` with the admin token. SIGTERM/Ctrl-C stop it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvicorn
from pydantic import ValidationError

from flywheel.assembly import build_gateway, build_recorder, choose_engine, start_engine, tiny_model
from flywheel.cli.common import fail, refuse_exposure, usage
from flywheel.stack import StackSettings
from gateway.agl.journal import Journal
from gateway.agl.proxy import AglProxy, ProxyConfig
from gateway.agl.routes import create_agl_app, tenant_lookup
from gateway.agl.serving import AglService
from gateway.app import default_keystore
from gateway.server import run
from infra.bus.factory import make_bus
from infra.eventlog.api import create_eventlog_router
from infra.logging import configure_logging
from rollout_worker.agl_agent import main
from schemas import TOPICS

if TYPE_CHECKING:
    from gateway.upstream.client import Upstream


def register(app: typer.Typer) -> None:
    app.command("agl-server")(agl_server_command)
    app.command("agl-agent")(agl_agent_command)


def agl_server_command(
    key: Annotated[str, typer.Option("--key", envvar="AGL_KEY", help="the API key (tenant 'default')")],
    model: Annotated[str, typer.Option("--model", help="the model name AGL forces into every call")],
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Listen port (0: any free one).")
    ] = 8080,
    host: Annotated[str, typer.Option("--host", help="Listen address.")] = "127.0.0.1",
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="default FLYWHEEL_DATA_DIR")] = None,
    upstream: Annotated[
        str | None, typer.Option("--upstream", help="model server base URL (…/v1) instead of the engine")
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option("--model-dir", help="Hugging Face model directory for the embedded engine")
    ] = None,
    train_temperature: Annotated[
        float, typer.Option("--train-temperature", help="Sampling temperature of training rollouts.")
    ] = 1.0,
    val_temperature: Annotated[
        float, typer.Option("--val-temperature", help="Sampling temperature of validation rollouts.")
    ] = 0.7,
    no_logprobs: Annotated[bool, typer.Option("--no-logprobs", help="train mode asks no logprobs")] = False,
    hold_s: Annotated[
        float,
        typer.Option(
            "--pause-hold-s",
            min=0,
            help="while /proxy/pause is in effect, hold a call this long for resume before AGL's 429"
            " (default 0: the 429 at once, as AGL answers)",
        ),
    ] = 0.0,
) -> None:
    """Serve Agent Lightning 1.0's server API (rollouts, events, models, proxy, pause), durably."""
    if not key:
        usage("--key must not be empty (AGL_KEY)")
    if upstream is not None and not upstream.startswith(("http://", "https://")):
        usage(f"--upstream must start with http:// or https://: {upstream!r}")
    if model_dir is not None and not (model_dir / "config.json").is_file():
        usage(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    overrides: dict[str, Any] = {"model": model[:256], "gateway_host": host, "gateway_port": port}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    try:
        settings = StackSettings(**overrides)
    except ValidationError as exc:
        fail(str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, "))
    refuse_exposure(host, settings.admin_token.get_secret_value())
    configure_logging(
        "WARNING" if settings.log_level.upper() == "INFO" else settings.log_level, settings.log_json
    )
    config = ProxyConfig(model, train_temperature, val_temperature, not no_logprobs, hold_s)
    code = run(_serve(settings, key, config, upstream, model_dir))
    raise typer.Exit(code)


async def _serve(
    settings: StackSettings, key: str, config: Any, upstream_url: str | None, model_dir: Path | None
) -> int:
    stack = contextlib.AsyncExitStack()
    async with stack:
        bus = make_bus(settings)
        try:
            await bus.start()
            await bus.ensure_topics(list(TOPICS))
        except Exception as exc:
            fail(f"cannot start the {settings.bus} bus: {type(exc).__name__}: {exc}")
        stack.push_async_callback(bus.stop)
        store = await _recorder(settings, bus, stack)
        default = await _upstream(settings, upstream_url, model_dir, stack)
        keystore = default_keystore(settings.gateway)
        gateway = build_gateway(
            settings.gateway.model_copy(update={"gateway_id": f"agl-{settings.gateway.gateway_id}"}),
            bus,
            [default],
            keystore=keystore,
        )
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        journal = Journal(settings.data_dir / "agl" / "journal.sqlite")
        stack.callback(journal.close)
        service = AglService(
            journal=journal,
            publish=gateway.publish,
            episodes=gateway.episodes,
            model_name=config.model_name,
            salt_path=settings.data_dir / "agl" / "salt",
            producer=f"agl-server:{gateway.id}",
        )
        if store is not None:  # what the last process published but its in-process bus never delivered
            rows = await asyncio.to_thread(
                store.query,
                f"SELECT DISTINCT event_id FROM {store.database}.events WHERE startsWith(producer, 'agl-server:')",
                max_rows=100_000_000,
            )
            service.replayed_events = await service.republish({str(r[0]) for r in rows.rows})
        proxy = AglProxy(service, gateway, config, default)
        stack.push_async_callback(proxy.aclose)
        app = create_agl_app(
            service,
            proxy,
            tenant_lookup(key, keystore.tenant_for),
            max_body_bytes=settings.gateway.max_body_bytes,
        )
        if store is not None:
            app.include_router(create_eventlog_router(store, settings.admin_token.get_secret_value()))
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=settings.gateway.gateway_host,
                port=settings.gateway.gateway_port,
                access_log=False,
                log_level="warning",
                proxy_headers=False,
                timeout_keep_alive=120,
            )
        )
        # uvicorn re-raises SIGTERM/SIGINT once it has stopped serving, which would kill the process
        # before the stack below is unwound (recorder flush, journal close): stop it ourselves instead.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        typer.echo(
            f"agl-server on http://{settings.gateway.gateway_host}:{settings.gateway.gateway_port} "
            f"(model {config.model_name}, upstream {default.url}, {service.replayed} records replayed, "
            f"{service.replayed_events} events republished, "
            f"data dir {settings.data_dir})",
            err=True,
        )
        await server.serve()
    return 0


async def _recorder(settings: StackSettings, bus: Any, stack: Any) -> Any:
    """On the in-process bus, this process records every topic to chdb (nothing else can)."""
    if settings.bus != "memory" or not settings.record_events:
        return None

    try:
        process = await build_recorder(settings.eventlog, bus)
    except Exception as exc:
        fail(f"cannot open the event log: {type(exc).__name__}: {exc}")
    stack.push_async_callback(process.stop)  # writes the last batches, then closes the store
    await process.start()
    return process.store


async def _upstream(settings: StackSettings, url: str | None, model_dir: Path | None, stack: Any) -> Upstream:
    """The default upstream: ``--upstream``, or the embedded engine on ``--model-dir`` (a toy model
    without one), chosen and started by ``flywheel.assembly`` as for every entry point."""
    if url is None and model_dir is None:
        model_dir = await asyncio.to_thread(tiny_model)
    running = await start_engine(
        choose_engine(model_dir=model_dir, upstream_url=url),
        model_name=settings.model,
        max_num_seqs=settings.engine_max_num_seqs,
        threads=settings.engine_threads or None,
    )
    stack.push_async_callback(running.stop)
    up = running.upstream(settings.gateway)
    stack.push_async_callback(up.client.aclose)
    return up


def agl_agent_command(
    agent_class: Annotated[str, typer.Argument(help="the AGL agent class, package.module:Class")],
    env_map: Annotated[
        list[str] | None,
        typer.Option("--env-map", help="NAME=input.path (AGL's config.local.env_map); repeat"),
    ] = None,
    path: Annotated[
        list[Path] | None, typer.Option("--path", help="a directory to import the agent from; repeat")
    ] = None,
    python: Annotated[
        Path | None, typer.Option("--python", help="run the class in this interpreter (the agent's venv)")
    ] = None,
) -> None:
    """Run an Agent Lightning agent class for the worker's task, as AGL's local controller does."""
    mapping: dict[str, str] = {}
    for item in env_map or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            usage(f"--env-map wants NAME=input.path, got {item!r}")
        mapping[name] = value
    if python is not None and not python.is_file():
        usage(f"--python {python}: no such interpreter")
    dirs = [str(p.resolve()) for p in path or []]
    sys.path[:0] = dirs
    sys.path.insert(0, "")  # as `python -c` does: the working directory first
    raise typer.Exit(main(agent_class, mapping, python=str(python) if python else None, paths=dirs))
