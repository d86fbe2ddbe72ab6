"""``flywheel status``, ``doctor``, ``topics create|ls|asyncapi``, ``healthcheck`` and ``up``.

Exit codes (every command): 0 done; 1 something it depends on is wrong (unreachable, refused,
unhealthy); 2 the command line is wrong. Errors are one line on stderr; ``--json`` prints one object.
Shell completion: ``flywheel --install-completion`` (typer's, for bash/zsh/fish/PowerShell).
"""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from flywheel.cli.common import (
    ADMIN_URL_HELP,
    JSON_HELP,
    admin_url,
    fail,
    load_settings,
    print_json,
    quiet_libraries,
    register_ls,
    usage,
)
from flywheel.ops.admin import AdminClient, AdminError
from flywheel.ops.doctor import check_clickhouse, check_kafka, run_doctor, upstreams_from_env
from flywheel.ops.status import StatusReport, kafka_status, topic_lags
from infra.bus.asyncapi import render
from infra.bus.base import BusError
from infra.bus.factory import make_bus
from schemas import TASKS, TOPICS, tasks_topic

if TYPE_CHECKING:
    from flywheel.ops.doctor import Check

JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
UrlOpt = Annotated[str | None, typer.Option("--url", help=ADMIN_URL_HELP, show_default=False)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each dependency.", min=0.1)]

topics_app = typer.Typer(help="Kafka topics: create them with their partition counts, list them with lag.")


# ----------------------------------------------------------------------------------- topics


async def _with_bus(action: Any) -> Any:

    settings = load_settings()
    if settings.bus != "kafka":
        fail(
            "FLYWHEEL_BUS=memory: the in-process bus lives inside `flywheel up`; "
            "set FLYWHEEL_BUS=kafka (and FLYWHEEL_KAFKA_BOOTSTRAP) to manage a broker's topics"
        )
    bus = make_bus(settings)
    try:
        await bus.start()
        return await action(bus)
    except BusError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        await bus.stop()


@topics_app.command("create")
def topics_create(
    pool: Annotated[
        list[str] | None, typer.Option("--pool", help="Also create flywheel.tasks.<POOL> (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create Flywheel's topics (idempotent), with the partition counts of schemas.TOPICS."""
    names = [*TOPICS, *(tasks_topic(p) for p in pool or [])]
    for p in pool or []:
        if not p or not all(c.isalnum() or c in "-_" for c in p):
            usage(f"pool names are letters, digits, '-' and '_': {p!r}")

    async def create(bus: Any) -> list[str]:
        await bus.ensure_topics(names)
        return list(await bus.list_topics())

    existing = asyncio.run(_with_bus(create))
    if as_json:
        print_json({"created_or_present": names, "topics": existing})
    else:
        typer.echo(f"topics ready: {', '.join(names)}")


@topics_app.command("asyncapi")
def topics_asyncapi(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the document here instead of stdout.", show_default=False),
    ] = None,
) -> None:
    """Print the AsyncAPI 3.0 document of Flywheel's topics and events (JSON; docs/asyncapi.json)."""
    text = render(version("flywheel"))
    if out is None:
        typer.echo(text, nl=False)
        return
    if out.is_dir():
        usage(f"--out is a directory: {out}")
    try:
        out.write_text(text)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")


async def _remote_lags(url: str) -> dict[str, dict[str, int]]:

    token = load_settings().admin_token.get_secret_value()
    try:
        data = await AdminClient(url, token).get("/admin/ops/status")
    except AdminError as exc:
        fail(str(exc))
    return dict(data.get("topics") or {})


def topics_ls(url: UrlOpt = None, as_json: JsonOpt = False) -> None:
    """List Flywheel's topics with partitions and the lag of each service's consumer group."""
    remote = admin_url(url)
    lags: dict[str, dict[str, int]] = asyncio.run(_remote_lags(remote) if remote else _with_bus(topic_lags))
    rows: list[dict[str, Any]] = []
    for topic, groups in lags.items():
        spec = TOPICS.get(TASKS if topic.startswith(TASKS + ".") else topic)
        rows.append({"topic": topic, "partitions": spec.partitions if spec else None, "lag": groups})
    if as_json:
        print_json({"topics": rows})
        return

    table = Table("topic", "partitions", "consumer lag")
    for row in rows:
        lag = ", ".join(f"{g}={n}" for g, n in row["lag"].items()) or "-"
        table.add_row(row["topic"], str(row["partitions"] or "?"), lag)
    Console().print(table if rows else "no Flywheel topics on this broker: run `flywheel topics create`")


# ----------------------------------------------------------------------------------- status


async def _status(url: str | None, gateway_url: str | None, timeout_s: float) -> StatusReport:

    settings = load_settings()
    token = settings.admin_token.get_secret_value()
    if url:
        try:
            data = await AdminClient(url, token, timeout_s=timeout_s).get("/admin/ops/status")
        except AdminError as exc:
            fail(str(exc))
        return StatusReport.from_dict(data)
    if settings.bus != "kafka":
        fail(
            "nothing to ask: the embedded stack's state lives in the `flywheel up` process; pass --url "
            "(it prints its admin URL) or set FLYWHEEL_BUS=kafka for a distributed deployment"
        )
    bus = make_bus(settings)
    try:
        async with asyncio.timeout(timeout_s * 4):
            await bus.start()
            report = await kafka_status(
                bus, settings.kafka_bootstrap, settings.topic_prefix, timeout_s=timeout_s
            )
    except (BusError, TimeoutError) as exc:
        fail(f"Kafka at {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}")
    finally:
        await bus.stop()
    if gateway_url:
        try:
            report.gateway = await AdminClient(gateway_url, token, timeout_s=timeout_s).get("/admin/state")
        except AdminError as exc:
            report.problems.append(f"gateway: {exc}")
    return report


def _print_status(report: StatusReport) -> None:

    console = Console()
    console.print(f"[bold]Flywheel[/bold] {report.runtime} · bus: {report.bus}")
    services = Table("service", "up", "detail", title="services")
    for name, info in report.services.items():
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if k != "up")
        services.add_row(name, "[green]yes[/green]" if info.get("up") else "[red]no[/red]", detail)
    console.print(services)
    topics = Table("topic", "consumer lag", title="topics")
    for topic, groups in report.topics.items():
        topics.add_row(topic, ", ".join(f"{g}={n}" for g, n in groups.items()) or "-")
    console.print(topics)
    c = report.control
    console.print(
        f"weights: v{c.get('weight_version', '?')}"
        + (f" (updating to v{c['pending_version']})" if c.get("pending_version") is not None else "")
        + f" · trainer step: {c.get('trainer_step', '-')}"
        + (f" · last failure: {c['last_failure']}" if c.get("last_failure") else "")
    )
    if report.gateway is not None:
        g = report.gateway
        console.print(
            f"gateway: paused={g.get('paused')} spool_depth={g.get('spool_depth')} "
            f"in_flight={g.get('in_flight')} weight_version={g.get('weight_version')}"
        )
    for problem in report.problems:
        console.print(f"[red]problem:[/red] {problem}")


def status_command(
    url: UrlOpt = None,
    gateway: Annotated[
        str | None,
        typer.Option(
            "--gateway", envvar="FLYWHEEL_GATEWAY_URL", help="Gateway to ask for its state (Kafka mode)."
        ),
    ] = None,
    timeout: TimeoutOpt = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Services, consumer-group lag per topic, gateway state, weight version and trainer step.

    Against a distributed deployment (FLYWHEEL_BUS=kafka) it asks Kafka; against the embedded stack,
    the running `flywheel up` (--url). Exit 1 when a service is down or something is unreachable.
    """
    report = asyncio.run(_status(admin_url(url), gateway, timeout))
    if as_json:
        print_json(report.as_dict())
    else:
        _print_status(report)
    if report.problems:
        raise typer.Exit(1)


# ----------------------------------------------------------------------------------- doctor


def _print_checks(checks: list[Check]) -> None:

    marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
    table = Table("check", "", "detail", "how to fix")
    for c in checks:
        table.add_row(c.name, marks[c.level], c.detail, c.fix if c.level != "ok" else "")
    Console().print(table)


def doctor_command(
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream", help="Model server base URL to probe (repeatable); default FLYWHEEL_UPSTREAM_URLS."
        ),
    ] = None,
    url: UrlOpt = None,
    timeout: TimeoutOpt = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Check Kafka, ClickHouse/chdb, upstream model servers, the admin token and package versions.

    Prints what is wrong and how to fix it; exit 1 if any check failed (warnings do not fail).
    """
    quiet_libraries()
    checks = asyncio.run(
        run_doctor(upstreams=upstream or upstreams_from_env(), admin_url=admin_url(url), timeout_s=timeout)
    )
    failed = [c for c in checks if c.level == "fail"]
    if as_json:
        print_json({"ok": not failed, "checks": [c.as_dict() for c in checks]})
    else:
        _print_checks(checks)
        typer.echo(f"{len(failed)} problem(s) found" if failed else "all good")
    if failed:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------ healthcheck


async def _health(http: str | None, kafka: bool, clickhouse: bool, timeout_s: float) -> list[str]:
    problems: list[str] = []
    if http:
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                response = await client.get(http)
            if response.status_code >= 400:
                problems.append(f"{http} answered {response.status_code}")
        except httpx.HTTPError as exc:
            problems.append(f"{http}: {type(exc).__name__}")
    if kafka or clickhouse:
        settings = load_settings()
        if kafka:
            check = await check_kafka(settings, timeout_s)
            if check.level == "fail" and "unreachable" in check.detail:
                problems.append(check.detail)
        if clickhouse:
            check = await check_clickhouse(settings, timeout_s)
            if check.level == "fail":
                problems.append(check.detail)
    return problems


def healthcheck_command(
    http: Annotated[str | None, typer.Option("--http", help="URL that must answer 2xx/3xx.")] = None,
    kafka: Annotated[
        bool, typer.Option("--kafka", help="The configured Kafka broker must be reachable.")
    ] = False,
    clickhouse: Annotated[
        bool, typer.Option("--clickhouse", help="The configured ClickHouse must answer.")
    ] = False,
    timeout: TimeoutOpt = 4.0,
    as_json: JsonOpt = False,
) -> None:
    """Container health probe: exit 0 when every requested check passes, else 1 with one line."""
    if not (http or kafka or clickhouse):
        usage("nothing to check: pass --http URL, --kafka and/or --clickhouse")
    problems = asyncio.run(_health(http, kafka, clickhouse, timeout))
    if as_json:
        print_json({"healthy": not problems, "problems": problems})
        if problems:
            raise typer.Exit(1)
        return
    if problems:
        fail("; ".join(problems))
    typer.echo("healthy")


def register(app: typer.Typer) -> None:
    register_ls(topics_app, topics_ls)
    app.add_typer(topics_app, name="topics")
    app.command("status")(status_command)
    app.command("doctor")(doctor_command)
    app.command("healthcheck")(healthcheck_command)
