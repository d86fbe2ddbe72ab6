"""``flywheel replay``: past scored episodes republished as ``EpisodeScored(source=replay)``.

Replay publishes on Kafka directly; on the embedded stack it asks the running ``flywheel up`` to
publish on its in-process bus (``--url``). ``export`` and ``stats``, the other commands that read the
event log, live beside it (``export_cmd``, ``stats_cmd``); the options they share in ``eventlog_opts``.
Exit codes: 0 done (also "nothing matched"), 1 a dependency failed, 2 a malformed option, in one line.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from flywheel.cli.common import admin_url, fail, load_settings, print_json, usage
from flywheel.cli.eventlog_opts import (
    JsonOpt,
    MinRewardOpt,
    SinceOpt,
    TenantOpt,
    UntilOpt,
    UrlOpt,
    number_option,
    open_log_reader,
    parse_rate,
    parse_weight_versions,
    time_option,
)
from flywheel.cli.vllm_cmd import tokenizer_fingerprint
from flywheel.ops.admin import AdminClient, AdminError
from flywheel.replay import (
    Pace,
    ReplayFilter,
    ReplayFilterError,
    ReplayReport,
    ReplayStalledError,
    TokenizerMismatchError,
    first_error,
    replay,
)
from infra.bus.base import Bus, BusError
from infra.bus.factory import make_bus
from infra.eventlog.errors import EventLogError
from infra.tokenizer_fingerprint import is_fingerprint
from trainer.settings import TrainerSettings


def _print_report(report: ReplayReport, flt: ReplayFilter) -> None:
    if report.selected == 0:
        described = ", ".join(
            f"{k}={v}" for k, v in flt.model_dump(exclude_none=True, exclude={"limit"}).items()
        )
        typer.echo(f"no scored episodes match the filter ({described or 'no filter'}); nothing to replay")
        return
    skipped = sum(report.skipped.values())
    reasons = ", ".join(f"{r}: {n}" for r, n in sorted(report.skipped.items()))
    typer.echo(f"selected: {report.selected}" + (f" (source: {flt.source} only)" if flt.source else ""))
    typer.echo(f"skipped:  {skipped}" + (f" ({reasons})" if reasons else ""))
    verb = "would send" if report.dry_run else "sent"
    typer.echo(f"{verb}: {report.eligible if report.dry_run else report.sent} in {report.groups} group(s)")
    if report.production:
        typer.echo(
            f"production: {report.production} session(s), each trained against its tenant's baseline"
            + (" and paced as one group" if report.paced else "")
        )
    if report.paced:
        typer.echo(f"paced:    {report.steps_taken} of {report.steps} step(s) trained as they were sent")
    if report.tokenizer_unknown:
        typer.echo(
            f"note: {report.tokenizer_unknown} episode(s) were recorded without a tokenizer fingerprint "
            "(before calls carried one): replayed unchecked"
        )
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
    reader = open_log_reader(url)
    bus: Bus | None = None
    try:
        if not dry_run:
            bus = make_bus(settings)
            await bus.start()
        with Progress(console=Console(stderr=True), transient=True) as progress:
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
    except TokenizerMismatchError as exc:
        fail(str(exc))
    except BusError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    except EventLogError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        if bus is not None:
            await bus.stop()
        reader.close()


PROGRESS_EVERY_S = 5.0


def progress_line(data: dict[str, Any]) -> str:
    """One line of a paced replay's progress, from ``GET /admin/ops/replay/{run_id}``."""
    head = f"replay {data.get('run_id', '?')}: "
    if not data.get("selected"):
        return head + "selecting episodes…"
    eligible = int(data["selected"]) - sum(int(n) for n in (data.get("skipped") or {}).values())
    line = head + f"{data.get('sent', 0)} of {eligible} episode(s) sent"
    if data.get("steps"):
        line += f", {data.get('steps_taken', 0)} of {data['steps']} trainer step(s) taken"
    return line


async def _replay_remote(
    url: str, flt: ReplayFilter, rate: float | None, pace: Pace | None, dry_run: bool
) -> ReplayReport:

    token = load_settings().admin_token.get_secret_value()
    body: dict[str, Any] = {"filter": flt.model_dump(mode="json"), "rate": rate, "dry_run": dry_run}
    if pace is not None:
        body["pace"] = {"groups_per_step": pace.groups_per_step, "step_timeout_s": pace.step_timeout_s}
    client = AdminClient(url, token, timeout_s=600)
    if pace is None and not dry_run:  # a dry run answers at once; a paced one reports progress below
        typer.echo(f"replaying through {url} (the stack answers when it is done)", err=True)
    try:
        data = await client.post("/admin/ops/replay", body)
        # A paced replay runs on in the stack: follow its progress until it ends, a line on stderr
        # every PROGRESS_EVERY_S seconds (stdout keeps only the report).
        loop = asyncio.get_running_loop()
        shown = -PROGRESS_EVERY_S
        while data.get("state") == "running":
            if loop.time() - shown >= PROGRESS_EVERY_S:
                typer.echo(progress_line(data), err=True)
                shown = loop.time()
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
        production=data.get("production", 0),
        tokenizer_unknown=data.get("tokenizer_unknown", 0),
        dry_run=data["dry_run"],
        run_id=data["run_id"],
        paced=data.get("paced", False),
        steps=data.get("steps", 0),
        steps_taken=data.get("steps_taken", 0),
    )


TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="The target model's directory (or its `flywheel model fingerprint`): refuse episodes "
        "whose token ids another tokenizer made.",
    ),
]


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
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="production: deployed agents' sessions only (each trained against its tenant's "
            "baseline); live: training rollouts only; all (default).",
        ),
    ] = "all",
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
    tokenizer: TokenizerOpt = None,
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
        if source not in ("all", "live", "production"):
            raise ReplayFilterError(f"--source must be production, live or all, got {source!r}")
        if not limit.isdigit() or int(limit) < 1:
            raise ReplayFilterError(f"--limit must be a positive whole number, got {limit!r}")
        flt = ReplayFilter(
            since=time_option(since),
            until=time_option(until),
            tenant=tenant,
            min_reward=number_option(min_reward, "--min-reward"),
            min_weight_version=lo,
            max_weight_version=hi,
            task_pattern=task_filter,
            policy=policy,
            source=None if source == "all" else source,
            limit=int(limit),
            tokenizer=_fingerprint(tokenizer),
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


def _fingerprint(tokenizer: str | None) -> str | None:
    """``--tokenizer``: a fingerprint as given, or the one of a model directory's tokenizer."""
    if tokenizer is None or is_fingerprint(tokenizer):
        return tokenizer
    path = Path(tokenizer).expanduser()
    if not path.is_dir():
        raise ReplayFilterError(
            f"--tokenizer takes a model directory or a 16-digit fingerprint, got {tokenizer!r}"
        )
    return tokenizer_fingerprint(path)


def _trainer_batch_groups() -> int:

    return TrainerSettings().trainer_batch_groups


def _one_line(exc: Exception) -> str:

    return first_error(exc) if isinstance(exc, ValueError) else str(exc)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
