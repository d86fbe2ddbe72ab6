"""``flywheel stats``: reward, success, transitions, policy versions and production feedback over time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from flywheel.cli.common import fail, print_json, usage
from flywheel.cli.eventlog_opts import (
    JsonOpt,
    SinceOpt,
    UntilOpt,
    UrlOpt,
    number_option,
    open_log_reader,
    time_option,
)
from flywheel.ops.plots import plot_stats
from infra.eventlog.errors import EventLogError


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
    threshold = number_option(success_threshold, "--success-threshold")
    lo, hi = time_option(since), time_option(until)
    if plot is not None and plot.suffix.lower() != ".png":
        usage(f"--plot writes a PNG; give a .png path, got {plot}")
    if plot is not None and by_policy:
        usage("--plot draws one series: pick one policy with --policy instead of --by-policy")
    if policy is not None and not policy.strip():
        usage("--policy must name a policy")
    reader = open_log_reader(url)
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
    app.command("stats")(stats_command)
