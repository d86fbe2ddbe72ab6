"""The options ``flywheel replay``, ``export`` and ``stats`` share: the episode filter and the event log.

The parsers (time, weight versions, rate) raise :class:`flywheel.replay.ReplayFilterError`, which the
commands turn into one line and exit 2.

Reads go through :func:`infra.eventlog.client.open_reader` (the chdb directory when it is free, the
ClickHouse server, or a running process's admin API with ``--url``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from flywheel.cli.common import ADMIN_URL_HELP, JSON_HELP, admin_url, fail, load_settings, usage
from flywheel.replay import ReplayFilterError
from infra.eventlog.client import open_reader
from infra.eventlog.errors import EventLogError
from infra.eventlog.reader import EventLogReader
from infra.eventlog.timeparse import parse_when


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """The command line's one time syntax (``infra.eventlog.timeparse``), as a filter error."""
    try:
        return parse_when(text, now=now)
    except ValueError as exc:
        raise ReplayFilterError(str(exc)) from None


def parse_weight_versions(text: str) -> tuple[int | None, int | None]:
    """``3`` → (3, 3); ``2..5`` → (2, 5); ``..5`` / ``2..`` open on one side."""
    value = text.strip()
    lo_text, sep, hi_text = value.partition("..")
    try:
        lo = int(lo_text) if lo_text else None
        hi = (int(hi_text) if hi_text else None) if sep else lo
    except ValueError:
        raise ReplayFilterError(f"cannot read weight version {text!r}: use N, A..B, ..B or A..") from None
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):
        raise ReplayFilterError(f"weight versions are never negative: {text!r}")
    if lo is None and hi is None:
        raise ReplayFilterError(f"cannot read weight version {text!r}: use N, A..B, ..B or A..")
    if lo is not None and hi is not None and lo > hi:
        raise ReplayFilterError(f"weight version range {text!r} is empty")
    return lo, hi


def parse_rate(text: str) -> float:
    """``50``, ``50/s``, ``3000/m`` → events per second (> 0)."""
    value = text.strip().lower()
    per = 1.0
    for suffix, seconds in (("/s", 1.0), ("/m", 60.0), ("/min", 60.0), ("/h", 3600.0)):
        if value.endswith(suffix):
            value, per = value[: -len(suffix)], seconds
            break
    try:
        rate = float(value) / per
    except ValueError:
        raise ReplayFilterError(f"cannot read rate {text!r}: use N/s (e.g. 20/s)") from None
    if not rate > 0 or rate == float("inf"):
        raise ReplayFilterError(f"rate must be a positive number of events per second, got {text!r}")
    return rate


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
