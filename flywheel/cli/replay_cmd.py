"""``flywheel replay``, ``flywheel export`` and ``flywheel stats``: the event log put back to work.

Reads go through :func:`infra.eventlog.client.open_reader` (the chdb directory when it is free, the
ClickHouse server, or a running process's admin API with ``--url``). Replay publishes on Kafka
directly; on the embedded stack it asks the running ``flywheel up`` to publish on its in-process bus.
Exit codes: 0 done (also "nothing matched"), 1 a dependency failed, 2 a malformed option, in one line.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from flywheel.cli.common import (
    ADMIN_URL_HELP,
    JSON_HELP,
    admin_url,
    fail,
    load_settings,
    print_json,
    usage,
)
from flywheel.export import ExportFilter, MergeError, export, export_merged
from flywheel.ops.admin import AdminClient, AdminError
from flywheel.ops.plots import plot_stats
from flywheel.replay import (
    Pace,
    ReplayFilter,
    ReplayFilterError,
    ReplayReport,
    ReplayStalledError,
    _first_error,
    parse_rate,
    parse_time,
    parse_weight_versions,
    replay,
)
from infra.bus.base import Bus, BusError
from infra.bus.factory import make_bus
from infra.eventlog.client import open_reader
from infra.eventlog.errors import EventLogError
from trainer.settings import TrainerSettings

if TYPE_CHECKING:
    from infra.eventlog.client import EventLogReader

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


def _time(value: str | None) -> datetime | None:

    if value is None:
        return None
    try:
        return parse_time(value)
    except ReplayFilterError as exc:
        usage(str(exc))


def _float(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        usage(f"{name} must be a number, got {value!r}")
    if number != number or number in (float("inf"), float("-inf")):
        usage(f"{name} must be a finite number, got {value!r}")
    return number


def _reader(url: str | None) -> EventLogReader:

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


# ----------------------------------------------------------------------------------- replay


def _print_report(report: ReplayReport, flt: ReplayFilter) -> None:
    if report.selected == 0:
        described = ", ".join(
            f"{k}={v}" for k, v in flt.model_dump(exclude_none=True, exclude={"limit"}).items()
        )
        typer.echo(f"no scored episodes match the filter ({described or 'no filter'}); nothing to replay")
        return
    skipped = sum(report.skipped.values())
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(report.skipped.items()))
    typer.echo(f"selected: {report.selected}")
    typer.echo(f"skipped:  {skipped}" + (f" ({reasons})" if reasons else ""))
    verb = "would send" if report.dry_run else "sent"
    typer.echo(f"{verb}: {report.eligible if report.dry_run else report.sent} in {report.groups} group(s)")
    if report.paced:
        typer.echo(f"paced:    {report.steps_taken} of {report.steps} step(s) trained as they were sent")
    if report.flat_groups:
        typer.echo(
            f"note: {report.flat_groups} group(s) have one reward for every member; "
            "group-relative advantages give them no signal"
            + (" (left out: no_signal)" if report.paced else "")
        )


async def _replay_kafka(
    flt: ReplayFilter, rate: float | None, pace: Pace | None, dry_run: bool, url: str | None
) -> ReplayReport:

    settings = load_settings()
    reader = _reader(url)
    bus: Bus | None = None
    try:
        if not dry_run:
            bus = make_bus(settings)
            await bus.start()
        with Progress(transient=True) as progress:
            task = progress.add_task("replaying", total=None)
            report = await replay(
                reader,
                bus,
                flt,
                rate=rate,
                pace=pace,
                dry_run=dry_run,
                on_planned=lambda n: progress.update(task, total=n),
                on_sent=lambda _: progress.advance(task),
            )
        return report
    except ReplayStalledError as exc:
        fail(f"replay stalled: {exc} (--no-pace sends everything at once)")
    except BusError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    except EventLogError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        if bus is not None:
            await bus.stop()
        reader.close()


async def _replay_remote(
    url: str, flt: ReplayFilter, rate: float | None, pace: Pace | None, dry_run: bool
) -> ReplayReport:

    token = load_settings().admin_token.get_secret_value()
    body: dict[str, Any] = {"filter": flt.model_dump(mode="json"), "rate": rate, "dry_run": dry_run}
    if pace is not None:
        body["pace"] = {"groups_per_step": pace.groups_per_step, "step_timeout_s": pace.step_timeout_s}
    client = AdminClient(url, token, timeout_s=600)
    try:
        data = await client.post("/admin/ops/replay", body)
        # A paced replay runs on in the stack: follow its progress until it ends.
        while data.get("state") == "running":
            await asyncio.sleep(1.0)
            data = await client.get(f"/admin/ops/replay/{data['run_id']}")
    except AdminError as exc:
        fail(str(exc))
    if data.get("state") == "failed":
        fail(
            f"replay stalled after {data['sent']} episodes: {data['error']} (--no-pace sends everything at once)"
        )
    return ReplayReport(
        selected=data["selected"],
        skipped=Counter(data["skipped"]),
        sent=data["sent"],
        groups=data["groups"],
        flat_groups=data["flat_groups"],
        dry_run=data["dry_run"],
        run_id=data["run_id"],
        paced=data.get("paced", False),
        steps=data.get("steps", 0),
        steps_taken=data.get("steps_taken", 0),
    )


def replay_command(
    since: SinceOpt = None,
    until: UntilOpt = None,
    tenant: TenantOpt = None,
    min_reward: MinRewardOpt = None,
    weight_version: Annotated[
        str | None, typer.Option("--weight-version", help="N, A..B, ..B or A.. (version that generated it).")
    ] = None,
    task_filter: Annotated[
        str | None, typer.Option("--task-filter", help="Glob on task_id, e.g. 'sql-*'.")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", help="With a policy map: only this policy's transitions (its adapter's calls)."
        ),
    ] = None,
    rate: Annotated[
        str | None, typer.Option("--rate", help="At most N episodes per second: 20/s, 600/m.")
    ] = None,
    limit: Annotated[str, typer.Option("--limit", help="At most this many episodes.")] = "10000",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Select and check; publish nothing.")] = False,
    paced: Annotated[
        bool,
        typer.Option(
            "--pace/--no-pace",
            help="Send the groups in their recorded order, one trainer step's worth at a time, the next "
            "once the trainer stepped (default); --no-pace sends everything at once.",
        ),
    ] = True,
    step_groups: Annotated[
        int | None,
        typer.Option(
            "--step-groups", help="Groups per trainer step (default: FLYWHEEL_TRAINER_BATCH_GROUPS)."
        ),
    ] = None,
    step_timeout: Annotated[
        float, typer.Option("--step-timeout", help="Seconds to wait for each trainer step before giving up.")
    ] = 300.0,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Republish past scored episodes as EpisodeScored(source=replay) for off-policy training.

    Behaviour logprobs and weight versions are kept, so the trainer's importance correction and
    staleness rules apply. Prints how many were selected, skipped (and why) and sent.
    """
    try:
        lo, hi = parse_weight_versions(weight_version) if weight_version is not None else (None, None)
        per_second = parse_rate(rate) if rate is not None else None
        if not limit.isdigit() or int(limit) < 1:
            raise ReplayFilterError(f"--limit must be a positive whole number, got {limit!r}")
        flt = ReplayFilter(
            since=_time(since),
            until=_time(until),
            tenant=tenant,
            min_reward=_float(min_reward, "--min-reward"),
            min_weight_version=lo,
            max_weight_version=hi,
            task_pattern=task_filter,
            policy=policy,
            limit=int(limit),
        )
        flt.to_episode_filter()  # cross-field checks (since < until, ...)
        groups = _trainer_batch_groups() if step_groups is None else step_groups
        pace = Pace(groups, step_timeout) if paced else None
    except (ReplayFilterError, ValueError) as exc:
        usage(_one_line(exc))
    settings = load_settings()
    remote = admin_url(url)
    if remote and settings.bus != "kafka":
        report = asyncio.run(_replay_remote(remote, flt, per_second, pace, dry_run))
    elif settings.bus != "kafka" and not dry_run:
        fail(
            "FLYWHEEL_BUS=memory: replay publishes on the running stack's in-process bus; pass --url "
            "(the admin URL `flywheel up` prints), or use --dry-run, or FLYWHEEL_BUS=kafka"
        )
    else:
        report = asyncio.run(_replay_kafka(flt, per_second, pace, dry_run, remote))
    if as_json:
        print_json(report.as_dict())
    else:
        _print_report(report, flt)


def _trainer_batch_groups() -> int:

    return TrainerSettings().trainer_batch_groups


def _one_line(exc: Exception) -> str:

    return _first_error(exc) if isinstance(exc, ValueError) else str(exc)


# ----------------------------------------------------------------------------------- export


def export_command(
    kind: Annotated[
        str, typer.Option("--kind", help="sft: chat messages (TRL); rl: token ids, masks, logprobs (verl).")
    ] = "rl",
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File to write (default flywheel-KIND.FORMAT).")
    ] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    tenant: TenantOpt = None,
    min_reward: MinRewardOpt = None,
    source: Annotated[str | None, typer.Option("--source", help="live, production or replay.")] = None,
    limit: Annotated[str | None, typer.Option("--limit", help="At most this many rows.")] = None,
    merged: Annotated[
        bool,
        typer.Option(
            "--merged",
            help="Not a dataset: write base + one policy's adapter (--policy) as one Hugging Face model "
            "directory (--output).",
        ),
    ] = False,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", help="Only this policy's rows; with --merged: the policy whose adapter is merged."
        ),
    ] = None,
    version: Annotated[
        str | None, typer.Option("--version", help="With --merged: the adapter's version (default: latest).")
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="With --merged: the trainer directory (default FLYWHEEL_DATA_DIR/trainer)."
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", help="With --merged: the base model (default: the one the checkpoint names)."
        ),
    ] = None,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export recorded data for other trainers (chat SFT data or token-level RL data), or with --merged a
    policy's adapter folded into the base as one model directory."""
    if merged or version is not None:
        _export_merged(policy, version, output, directory, model, merged, as_json)
        return

    if kind not in ("sft", "rl"):
        usage(f"--kind must be sft or rl, got {kind!r}")
    if fmt not in ("jsonl", "parquet"):
        usage(f"--format must be jsonl or parquet, got {fmt!r}")
    if source is not None and source not in ("live", "production", "replay"):
        usage(f"--source must be live, production or replay, got {source!r}")
    if limit is not None and (not limit.isdigit() or int(limit) < 1):
        usage(f"--limit must be a positive whole number, got {limit!r}")
    flt = ExportFilter(
        since=_time(since),
        until=_time(until),
        tenant=tenant,
        min_reward=_float(min_reward, "--min-reward"),
        source=source,
        policy=policy,
        limit=int(limit) if limit else None,
    )
    if flt.since and flt.until and flt.since >= flt.until:
        usage("--since must be before --until")
    path = output or Path(f"flywheel-{kind}.{fmt}")
    k: Literal["sft", "rl"] = "sft" if kind == "sft" else "rl"
    f: Literal["jsonl", "parquet"] = "parquet" if fmt == "parquet" else "jsonl"
    reader = _reader(url)
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task(f"exporting {kind}", total=None)
            report = export(reader, path, kind=k, fmt=f, flt=flt, on_rows=lambda n: progress.advance(task, n))
    except EventLogError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    finally:
        reader.close()
    if as_json:
        print_json(report.as_dict())
        return
    skipped = ", ".join(f"{r}: {n}" for r, n in sorted(report.skipped.items()))
    typer.echo(f"wrote {report.rows} {kind} row(s) to {path}" + (f" (skipped {skipped})" if skipped else ""))


def _export_merged(
    policy: str | None,
    version: str | None,
    output: Path | None,
    directory: Path | None,
    model: Path | None,
    merged: bool,
    as_json: bool,
) -> None:

    if not merged:
        usage("--version goes with --merged (a policy's adapter merged into the base)")
    if policy is None:
        usage("--merged needs --policy NAME (the policy whose adapter is merged into the base)")
    if version is not None and (not version.isdigit() or int(version) < 1):
        usage(f"--version must be a positive whole number, got {version!r}")
    root = directory if directory is not None else _trainer_root()
    path = output or Path(f"flywheel-merged-{policy}")
    try:
        report = export_merged(
            root, policy, path, version=int(version) if version else None, base_model=model
        )
    except MergeError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    if as_json:
        print_json(report.as_dict())
        return
    typer.echo(
        f"wrote {report.policy} v{report.version} merged into {report.base_model} to {report.path} "
        f"({report.bytes / 1e6:.1f} MB, {report.seconds:.1f} s)"
    )


def _trainer_root() -> Path:

    return TrainerSettings().trainer_root


# ------------------------------------------------------------------------------------ stats


def stats_command(
    since: SinceOpt = None,
    until: UntilOpt = None,
    bucket: Annotated[str, typer.Option("--bucket", help="minute, hour or day.")] = "hour",
    success_threshold: Annotated[
        str, typer.Option("--success-threshold", help="Reward that counts as success.")
    ] = "1.0",
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw the curves into this PNG.")] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="With a policy map: only episodes with calls of this policy; versions are its adapter's.",
        ),
    ] = None,
    by_policy: Annotated[
        bool, typer.Option("--by-policy", help="One row per bucket and policy ('-': the base).")
    ] = False,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reward, success rate, transitions per episode, policy versions and production feedback over time.

    For production traffic: the scored sessions per bucket, the share with user feedback and the share
    of those whose latest feedback is a thumbs up (a rating > 0, or a score ≥ the success threshold).
    """
    if bucket not in ("minute", "hour", "day"):
        usage(f"--bucket must be minute, hour or day, got {bucket!r}")
    threshold = _float(success_threshold, "--success-threshold")
    lo, hi = _time(since), _time(until)
    if plot is not None and plot.suffix.lower() != ".png":
        usage(f"--plot writes a PNG; give a .png path, got {plot}")
    if plot is not None and by_policy:
        usage("--plot draws one series: pick one policy with --policy instead of --by-policy")
    if policy is not None and not policy.strip():
        usage("--policy must name a policy")
    reader = _reader(url)
    try:
        points = reader.stats(
            since=lo,
            until=hi,
            bucket=bucket,  # type: ignore[arg-type]
            success_threshold=threshold or 0.0,
            policy=policy,
            by_policy=by_policy,
        )
    except EventLogError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        reader.close()
    rows = [p.model_dump(mode="json") for p in points]
    if plot is not None:
        try:
            plot_stats(points, plot)
        except OSError as exc:
            fail(f"cannot write {plot}: {exc.strerror or exc}")
    if as_json:
        print_json({"bucket": bucket, "points": rows, "plot": str(plot) if plot else None})
        return
    _print_stats(rows, plot, by_policy)


def _print_stats(rows: list[dict[str, Any]], plot: Path | None, by_policy: bool = False) -> None:
    def num(v: Any, digits: int = 3) -> str:
        return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))

    headers = [
        "bucket",
        "episodes",
        "mean reward",
        "success",
        "calls/ep",
        "transitions/ep",
        "weights (mean/max)",
    ]
    table = Table(*([*headers[:1], "policy", *headers[1:]] if by_policy else headers))
    production = any(r.get("production_sessions") for r in rows)
    if production:
        for column in ("production", "feedback", "thumbs up"):
            table.add_column(column)
    for r in rows:
        extra = (
            [str(r["production_sessions"]), num(r["feedback_rate"], 2), num(r["thumbs_up_rate"], 2)]
            if production
            else []
        )
        policy_cell = [r.get("policy") or "-"] if by_policy else []
        table.add_row(
            r["bucket"],
            *policy_cell,
            str(r["episodes"]),
            num(r["mean_reward"]),
            num(r["success_rate"], 2),
            num(r["mean_calls"], 2),
            num(r["mean_transitions"], 2),
            f"{num(r['mean_weight_version'], 1)}/{num(r['max_weight_version'])}",
            *extra,
        )
    console = Console()
    console.print(table if rows else "no scored episodes in this range")
    if plot is not None:
        console.print(f"plot written to {plot}")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
    app.command("export")(export_command)
    app.command("stats")(stats_command)
