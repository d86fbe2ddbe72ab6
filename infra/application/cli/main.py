"""``flywheel``: the admin CLI entry point.

Each command group lives in its own module under ``infra/application/cli/`` and is registered here; heavy
imports (torch, transformers, uvicorn apps) happen inside the commands, so ``flywheel --help``
stays fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="flywheel",
    help="Train the model behind your agent with RL from its own traffic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Train the model behind your agent with RL from its own traffic."""


def _register() -> None:
    # One line per command module; each module exposes ``register(app)``.
    from infra.application.cli import kafka_cmd, version_cmd

    version_cmd.register(app)
    kafka_cmd.register(app)
    from infra.application.cli import eventlog_cmd

    eventlog_cmd.register(app)
    from infra.application.cli import engine_cmd

    engine_cmd.register(app)
    from infra.application.cli import gateway_cmd

    gateway_cmd.register(app)
    from infra.application.cli import worker_cmd

    worker_cmd.register(app)
    from infra.application.cli import episodes_cmd

    episodes_cmd.register(app)
    from infra.application.cli import ops_cmd, replay_cmd

    ops_cmd.register(app)
    replay_cmd.register(app)
    from infra.application.cli import trainer_cmd

    trainer_cmd.register(app)
    from infra.application.cli import demo_cmd

    demo_cmd.register(app)
    from infra.application.cli import optimize_cmd

    optimize_cmd.register(app)

    from infra.application.cli import agl_cmd

    agl_cmd.register(app)
    from infra.application.cli import vllm_cmd

    vllm_cmd.register(app)
    from infra.application.cli import otel_cmd

    otel_cmd.register(app)
    from infra.application.cli import ui_cmd

    ui_cmd.register(app)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
