"""``flywheel engine``: serve a local Hugging Face model with the embedded engine's vLLM-compatible API."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("engine")
    def engine_command(
        model: Path = typer.Option(
            ..., "--model", help="Local Hugging Face model directory (config.json, weights, tokenizer)."
        ),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8100, "--port"),
        threads: int | None = typer.Option(None, "--threads", help="torch CPU threads (default: all cores)."),
        served_model_name: str | None = typer.Option(
            None, "--served-model-name", help="Name in /v1/models (default: the directory name)."
        ),
        max_num_seqs: int = typer.Option(64, "--max-num-seqs", help="Most sequences decoded in one batch."),
        max_model_len: int | None = typer.Option(
            None, "--max-model-len", help="Context length (default: the model's)."
        ),
        weight_version: int = typer.Option(
            0, "--weight-version", help="Version reported for the initial weights."
        ),
        admin_token: str | None = typer.Option(
            None,
            "--admin-token",
            envvar="FLYWHEEL_ENGINE_ADMIN_TOKEN",
            help="Require this bearer token on /pause, /resume, /load_weights.",
        ),
    ) -> None:
        """Serve MODEL alone over HTTP (chat, completions, streaming, pause/resume, load_weights)."""
        import os

        if not (model / "config.json").is_file():
            typer.echo(f"error: {model} is not a Hugging Face model directory (no config.json)", err=True)
            raise typer.Exit(2)
        import uvicorn

        from trainer.engine import InferenceEngine, UnsupportedModelError
        from trainer.engine.app import create_engine_app

        try:
            engine = InferenceEngine.from_pretrained(
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
        uvicorn.run(
            create_engine_app(engine, admin_token=admin_token), host=host, port=port, log_level="warning"
        )
