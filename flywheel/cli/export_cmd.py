"""``flywheel export``: recorded episodes as training data for other trainers, or a merged adapter.

``--kind sft`` writes chat messages (TRL), ``--kind rl`` token ids, masks and logprobs (verl), as
JSONL or Parquet; ``--merged`` writes a base model with one policy's adapter merged in. Exit codes: 0
done, 1 a dependency failed, 2 a malformed option, in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.progress import Progress

from flywheel.cli.common import fail, print_json, usage
from flywheel.cli.eventlog_opts import (
    JsonOpt,
    MinRewardOpt,
    SinceOpt,
    TenantOpt,
    UntilOpt,
    UrlOpt,
    number_option,
    open_log_reader,
    time_option,
)
from flywheel.export import ExportFilter, export
from flywheel.merged import MergeError, export_merged
from infra.eventlog.errors import EventLogError
from trainer.settings import TrainerSettings


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
        since=time_option(since),
        until=time_option(until),
        tenant=tenant,
        min_reward=number_option(min_reward, "--min-reward"),
        source=source,
        policy=policy,
        limit=int(limit) if limit else None,
    )
    if flt.since and flt.until and flt.since >= flt.until:
        usage("--since must be before --until")
    path = output or Path(f"flywheel-{kind}.{fmt}")
    k: Literal["sft", "rl"] = "sft" if kind == "sft" else "rl"
    f: Literal["jsonl", "parquet"] = "parquet" if fmt == "parquet" else "jsonl"
    reader = open_log_reader(url)
    try:
        with Progress(console=Console(stderr=True), transient=True) as progress:
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


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)
