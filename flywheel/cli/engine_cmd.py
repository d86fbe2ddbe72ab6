"""``flywheel engine``: serve a local Hugging Face model with the embedded engine's vLLM-compatible API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from flywheel.assembly import load_engine
from flywheel.cli.common import refuse_exposure
from infra.engine import UnsupportedModelError
from infra.engine.app import create_engine_app
from infra.engine.process import exit_with_parent
from infra.service import KEEP_ALIVE_S

Model = Annotated[
    Path,
    typer.Option("--model", help="Local Hugging Face model directory (config.json, weights, tokenizer)."),
]
Host = Annotated[str, typer.Option("--host", help="Listen address.")]
Port = Annotated[int, typer.Option("--port", help="Listen port.")]
Threads = Annotated[int | None, typer.Option("--threads", help="torch CPU threads (default: all cores).")]
ServedName = Annotated[
    str | None, typer.Option("--served-model-name", help="Name in /v1/models (default: the directory name).")
]
MaxSeqs = Annotated[int, typer.Option("--max-num-seqs", help="Most sequences decoded in one batch.")]
MaxLen = Annotated[int | None, typer.Option("--max-model-len", help="Context length (default: the model's).")]
Version = Annotated[int, typer.Option("--weight-version", help="Version reported for the initial weights.")]
AdminToken = Annotated[
    str | None,
    typer.Option(
        "--admin-token",
        envvar="FLYWHEEL_ENGINE_ADMIN_TOKEN",
        help="Require this bearer token on /pause, /resume and /load_weights.",
    ),
]

DEFAULT_PORT = 8000  # vLLM's port, where the gateway's default upstream points


def engine_command(
    model: Model,
    host: Host = "127.0.0.1",
    port: Port = DEFAULT_PORT,
    threads: Threads = None,
    served_model_name: ServedName = None,
    max_num_seqs: MaxSeqs = 64,
    max_model_len: MaxLen = None,
    weight_version: Version = 0,
    admin_token: AdminToken = None,
) -> None:
    """Serve a model alone over HTTP (chat, completions, streaming, pause/resume, load_weights)."""
    # beyond loopback, /load_weights, /load_adapter and /pause need a real token
    refuse_exposure(host, admin_token or "", "FLYWHEEL_ENGINE_ADMIN_TOKEN (--admin-token)")
    if not (model / "config.json").is_file():
        typer.echo(f"error: {model} is not a Hugging Face model directory (no config.json)", err=True)
        raise typer.Exit(2)

    try:
        engine = load_engine(
            model,
            threads=threads or os.cpu_count() or 1,
            model_name=served_model_name,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            weight_version=weight_version,
        )
    except (OSError, ValueError, UnsupportedModelError) as exc:
        typer.echo(f"error: cannot load {model}: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(
        f"serving {engine.model_name} (weight version {engine.weight_version}) on http://{host}:{port}/v1"
    )

    exit_with_parent()  # when a stack started it, it goes when the stack does

    uvicorn.run(
        create_engine_app(engine, admin_token=admin_token),
        host=host,
        port=port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def register(app: typer.Typer) -> None:
    app.command("engine")(engine_command)
