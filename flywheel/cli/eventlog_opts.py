"""The options ``flywheel replay``, ``export`` and ``stats`` share: the episode filter and the event log.

Reads go through :func:`infra.eventlog.client.open_reader` (the chdb directory when it is free, the
ClickHouse server, or a running process's admin API with ``--url``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from flywheel.cli.common import ADMIN_URL_HELP, JSON_HELP, admin_url, fail, load_settings, usage
from flywheel.replay import ReplayFilterError, parse_time
from infra.eventlog.client import EventLogReader, open_reader
from infra.eventlog.errors import EventLogError

JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
UrlOpt = Annotated[str | None, typer.Option("--url", help=ADMIN_URL_HELP, show_default=False)]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="ISO time (2026-11-30, 2026-11-30T12:00Z) or 30m/2h/7d ago.")
]
UntilOpt = Annotated[str | None, typer.Option("--until", help="ISO time or 30m/2h/7d ago (exclusive).")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's episodes.")]
MinRewardOpt = Annotated[
    str | None, typer.Option("--min-reward", help="Only episodes that scored at least this.")
]


def time_option(value: str | None) -> datetime | None:
    """``--since``/``--until``: an ISO time or an age (30m, 2h, 7d); malformed exits 2."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ReplayFilterError as exc:
        usage(str(exc))


def number_option(value: str | None, name: str) -> float | None:
    """A finite number option; malformed exits 2."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        usage(f"{name} must be a number, got {value!r}")
    if number != number or number in (float("inf"), float("-inf")):
        usage(f"{name} must be a finite number, got {value!r}")
    return number


def open_log_reader(url: str | None) -> EventLogReader:
    """The event log: a running process's admin API (``--url``), else ClickHouse or the chdb directory."""
    settings = load_settings()
    try:
        return open_reader(
            admin_url=admin_url(url),
            admin_token=settings.admin_token.get_secret_value(),
            clickhouse_url=settings.clickhouse_url,
            chdb_path=settings.chdb_path,
        )
    except EventLogError as exc:
        fail(f"{type(exc).__name__}: {exc}")
