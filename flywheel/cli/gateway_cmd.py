"""``flywheel gateway``, ``flywheel keys create|ls|revoke``, ``flywheel record -- CMD ARGS…``."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flywheel.alone import serve_gateway
from flywheel.assembly import RunningEngine, choose_engine
from flywheel.cli.common import JSON_HELP, fail, print_json, refuse_exposure, register_ls, usage
from flywheel.cli.episodes_cmd import admin_request, print_calls
from gateway.app import create_app
from gateway.keys import KeyStore
from gateway.protocol import FinishEpisodeRequest, OpenEpisodeRequest
from gateway.server import GatewayServer
from gateway.settings import GatewaySettings
from infra import service
from infra.bus.memory import MemoryBus
from infra.logging import configure_logging
from schemas import UpstreamKind

if TYPE_CHECKING:
    from gateway.upstream.client import Upstream

keys_app = typer.Typer(help="Tenant API keys for production traffic (stored hashed).", no_args_is_help=True)

Upstreams = Annotated[
    list[str] | None, typer.Option("--upstream", help="upstream base URL (…/v1); repeat for replicas")
]
Kind = Annotated[str | None, typer.Option("--kind", help="vllm | embedded | openai (text only)")]


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway_command)
    app.add_typer(keys_app, name="keys")
    app.command(
        "record",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(record_command)


def _settings(**overrides: Any) -> GatewaySettings:

    try:
        return GatewaySettings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:
        fail(f"bad settings: {str(exc).splitlines()[0]}")
        raise


def _upstreams(settings: GatewaySettings, urls: list[str] | None, kind: str | None) -> list[Upstream]:
    """One upstream per URL (``--upstream``, else ``FLYWHEEL_UPSTREAM_URLS``), each chosen and built by
    ``flywheel.assembly`` as for every entry point."""
    try:
        up_kind = UpstreamKind(kind) if kind else settings.upstream_kind
    except ValueError:
        fail(f"--kind must be one of: {', '.join(k.value for k in UpstreamKind)}")
        raise
    chosen = urls or [u.strip() for u in settings.upstream_urls.split(",") if u.strip()]
    for u in chosen:
        if not u.startswith(("http://", "https://")):
            fail(f"upstream URL must start with http:// or https://: {u!r}")
    settings = settings.model_copy(update={"upstream_kind": up_kind})
    return [RunningEngine(choose_engine(upstream_url=u)).upstream(settings) for u in chosen]


def gateway_command(
    upstream: Upstreams = None,
    kind: Kind = None,
    host: Annotated[
        str | None, typer.Option("--host", help="Listen address (default: FLYWHEEL_GATEWAY_HOST).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Listen port (default: FLYWHEEL_GATEWAY_PORT).")
    ] = None,
) -> None:
    """Run the gateway alone against an upstream model server and the configured bus."""
    settings = _settings(gateway_host=host, gateway_port=port)
    refuse_exposure(settings.gateway_host, settings.admin_token.get_secret_value())
    configure_logging(settings.log_level, settings.log_json)
    ups = _upstreams(settings, upstream, kind)
    try:
        service.run(
            serve_gateway(
                settings, ups, on_started=lambda url: typer.echo(f"gateway {settings.gateway_id} on {url}")
            )
        )
    except service.ServiceStartError as exc:
        fail(str(exc))


# ------------------------------------------------------------------------------------------ keys
def _keystore() -> Any:

    return KeyStore(_settings().data_dir / "gateway" / "keys.json")


TenantFilter = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's keys.")]
AsJson = Annotated[bool, typer.Option("--json", help=JSON_HELP)]


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant the key belongs to")],
    as_json: AsJson = False,
) -> None:
    """Create a key for TENANT and print it (it cannot be shown again)."""
    try:
        key_id, key = _keystore().create(tenant)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        print_json({"key_id": key_id, "tenant": tenant, "key": key})
        return
    typer.echo(f"key_id: {key_id}", err=True)
    typer.echo(key)


def keys_ls(tenant: TenantFilter = None, as_json: AsJson = False) -> None:
    """List keys (ids, tenants, state; never the keys themselves)."""
    rows = [
        {
            "key_id": r.key_id,
            "tenant": r.tenant,
            "created_at": dt.datetime.fromtimestamp(r.created_at, dt.UTC).isoformat(),
            "revoked": r.revoked,
        }
        for r in _keystore().list(tenant)
    ]
    if as_json:
        print_json(rows)
        return
    for row in rows:
        created = dt.datetime.fromisoformat(row["created_at"]).strftime("%Y-%m-%d %H:%M")
        typer.echo(
            f"{row['key_id']}\t{row['tenant']}\t{created}\t{'revoked' if row['revoked'] else 'active'}"
        )


register_ls(keys_app, keys_ls)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str | None, typer.Argument(help="the key id to revoke")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="revoke all keys of this tenant")] = None,
    as_json: AsJson = False,
) -> None:
    """Revoke one key (by id) or every key of a tenant."""
    if not key_id and not tenant:
        usage("give a key id or --tenant")
    n = _keystore().revoke(key_id, tenant=tenant)
    if n == 0:
        fail("no active key matched")
    if as_json:
        print_json({"revoked": n})
        return
    typer.echo(f"revoked {n} key(s)")


# ---------------------------------------------------------------------------------------- record
def record_command(
    ctx: typer.Context,
    upstream: Upstreams = None,
    kind: Kind = None,
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway",
            envvar="FLYWHEEL_GATEWAY_URL",
            help="use a running gateway instead of an in-process one",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the recorded calls as JSON")] = False,
) -> None:
    """Run CMD ARGS… as an agent in a new episode and print what was recorded.

    CMD gets OPENAI_BASE_URL, OPENAI_API_BASE and OPENAI_API_KEY pointing at the episode (and
    ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY for agents on Anthropic's Messages API).
    Without --gateway an in-process gateway is started against --upstream (or FLYWHEEL_UPSTREAM_URLS).
    """
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        fail("usage: flywheel record [OPTIONS] -- CMD ARGS…")

    settings = _settings()
    configure_logging(
        "WARNING" if settings.log_level.upper() == "INFO" else settings.log_level, settings.log_json
    )
    if gateway:
        code, calls = _record_remote(gateway, argv)
    else:
        code, calls = asyncio.run(_record_local(settings, _upstreams(settings, upstream, kind), argv))
    if as_json:
        typer.echo(json.dumps(calls, indent=1))
    else:
        print_calls(calls, title="recorded calls")
    raise typer.Exit(code)


def _agent_env(base_url: str) -> dict[str, str]:

    return {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_BASE": base_url,
        "OPENAI_API_KEY": "flywheel",
        "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),  # the anthropic SDK adds /v1 itself
        "ANTHROPIC_API_KEY": "flywheel",
    }


def _record_remote(gateway: str, argv: list[str]) -> tuple[int, list[dict[str, Any]]]:

    opened = admin_request(gateway, "POST", "/admin/episodes", {})
    episode_id, base_url = opened["episode_id"], opened["base_url"]
    typer.echo(f"episode {episode_id}: {base_url}", err=True)
    try:
        code = subprocess.call(argv, env=_agent_env(base_url))
    except OSError as exc:
        fail(f"cannot run {argv[0]!r}: {exc}")
        raise
    status = "ok" if code == 0 else "error"
    admin_request(gateway, "POST", f"/admin/episodes/{episode_id}/finish", {"status": status})
    return code, list(admin_request(gateway, "GET", f"/admin/episodes/{episode_id}")["calls"])


async def _record_local(
    settings: GatewaySettings, ups: list[Upstream], argv: list[str]
) -> tuple[int, list[dict[str, Any]]]:
    bus = MemoryBus()
    await bus.start()
    data_dir = Path(settings.data_dir)
    app = create_app(settings.model_copy(update={"data_dir": data_dir}), bus, ups)
    gw = app.state.gateway
    server = GatewayServer(app, host="127.0.0.1", port=0)
    try:
        url = await server.start()
        state = await gw.open_training(OpenEpisodeRequest())
        base_url = f"{url}/episodes/{state.episode_id}/v1"
        typer.echo(f"episode {state.episode_id}: {base_url}", err=True)
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=_agent_env(base_url))
        except OSError as exc:
            fail(f"cannot run {argv[0]!r}: {exc}")
            raise
        code = await proc.wait()
        await gw.finish_episode(state.episode_id, FinishEpisodeRequest(status="ok" if code == 0 else "error"))
        calls = [c.model_dump(mode="json") for c in gw.recent_calls(state.episode_id)]
        return code, calls
    finally:
        await server.stop()
        await bus.stop()
