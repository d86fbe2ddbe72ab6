"""``flywheel``: the admin CLI entry point.

The commands come from one table, :data:`COMMANDS`: a command's name, the module that registers it
(``register(app)``) and its one-line help. A module is imported only when its command runs, so
``flywheel --help`` lists every command without importing torch, transformers or the services. Each
command module imports what it needs at its top.

The demo is not part of the installed package: ``flywheel demo`` runs from a checkout, where
``examples/demo`` is importable, and says so in one line elsewhere.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from typer._click import Command, Context  # typer 0.29 vendors click; its types are these
from typer.core import TyperCommand, TyperGroup

COMMANDS: dict[str, tuple[str, str]] = {
    "version": ("flywheel.cli.version_cmd", "Print Flywheel's version."),
    "up": (
        "flywheel.cli.ops_up",
        "Run the whole embedded stack (gateway, engine, worker, reward, recorder, trainer) in one process.",
    ),
    "demo": (
        "examples.demo.cli",
        "Warm-start a tiny model, then train an agent (the calculator by default) through the whole pipeline.",
    ),
    "status": (
        "flywheel.cli.ops_cmd",
        "Services, consumer-group lag per topic, gateway state, weight version and trainer step.",
    ),
    "doctor": (
        "flywheel.cli.ops_cmd",
        "Check Kafka, ClickHouse/chdb, upstream model servers, the admin token and package versions.",
    ),
    "healthcheck": (
        "flywheel.cli.ops_cmd",
        "Container health probe: exit 0 when every requested check passes, else 1 with one line.",
    ),
    "topics": (
        "flywheel.cli.ops_cmd",
        "Kafka topics: create them with their partition counts, list them with lag.",
    ),
    "query": (
        "flywheel.cli.eventlog_cmd",
        "Run a read-only SQL query on the event log (writes are refused, exit 2).",
    ),
    "recorder": (
        "flywheel.cli.eventlog_cmd",
        "Run the recorder alone: every topic → the event log, with the event-log admin API.",
    ),
    "db": ("flywheel.cli.eventlog_cmd", "The ClickHouse event log: schema migrations."),
    "engine": (
        "flywheel.cli.engine_cmd",
        "Serve a model alone over HTTP (chat, completions, streaming, pause/resume, load_weights).",
    ),
    "gateway": (
        "flywheel.cli.gateway_cmd",
        "Run the gateway alone against an upstream model server and the configured bus.",
    ),
    "record": (
        "flywheel.cli.gateway_cmd",
        "Run CMD ARGS… as an agent in a new episode and print what was recorded.",
    ),
    "keys": ("flywheel.cli.gateway_cmd", "Tenant API keys for production traffic (stored hashed)."),
    "worker": (
        "flywheel.cli.worker_cmd",
        "Run a rollout worker: consume tasks, run agents, report episodes (until Ctrl-C).",
    ),
    "reward": (
        "flywheel.cli.worker_cmd",
        "Run the reward service: score finished episodes, publish transitions (until Ctrl-C).",
    ),
    "tasks": ("flywheel.cli.worker_cmd", "Submit rollout tasks."),
    "episodes": ("flywheel.cli.episodes_cmd", "Open and inspect training episodes."),
    "replay": (
        "flywheel.cli.replay_cmd",
        "Republish past scored episodes as EpisodeScored(source=replay) for off-policy training.",
    ),
    "export": (
        "flywheel.cli.export_cmd",
        "Export recorded data for other trainers (chat SFT or token-level RL data), or a merged adapter.",
    ),
    "stats": (
        "flywheel.cli.stats_cmd",
        "Reward, success rate, transitions per episode, policy versions and production feedback over time.",
    ),
    "trainer": ("flywheel.cli.trainer_cmd", "Run and control the trainer."),
    "weights": ("flywheel.cli.trainer_cmd", "Weight versions (checkpoints)."),
    "versions": (
        "flywheel.cli.versions_cmd",
        "Which version of each policy serves production: list, show, promote, roll back, pin, canary.",
    ),
    "gates": (
        "flywheel.cli.versions_cmd",
        "Run the gate keeper alone: every release candidate evaluated, canaries judged.",
    ),
    "optimize": (
        "flywheel.cli.optimize_cmd",
        "Optimise the agent's prompt with GEPA, every evaluation a real rollout through the stack.",
    ),
    "agl-server": (
        "flywheel.cli.agl_cmd",
        "Serve Agent Lightning 1.0's server API (rollouts, events, models, proxy, pause), durably.",
    ),
    "agl-agent": (
        "flywheel.cli.agl_cmd",
        "Run an Agent Lightning agent class for the worker's task, as AGL's local controller does.",
    ),
    "otel-export": (
        "flywheel.cli.otel_cmd",
        "Export recorded episodes as OpenTelemetry GenAI spans (consumer group otel-export) until stopped.",
    ),
    "ui": (
        "flywheel.cli.ui_cmd",
        "Serve the web view of the event log: episodes, their calls and tokens, training charts.",
    ),
    "kafka": (
        "flywheel.cli.kafka_cmd",
        "Run a local single-node Kafka (KRaft) broker from Maven Central jars.",
    ),
    "vllm": (
        "flywheel.cli.vllm_cmd",
        "A real vLLM server for Flywheel (its own environment: infra/scripts/vllm_env.sh).",
    ),
    "model": ("flywheel.cli.vllm_cmd", "Models a user can get without a model hub."),
}


def load_command(name: str) -> Command:
    """Import the module behind ``name`` and return its click command (or group)."""
    module_name, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if module_name.startswith("examples.") and (exc.name or "").startswith("examples"):
            typer.echo(
                f"error: `flywheel {name}` runs from a checkout of the repository (examples/ is not installed)",
                err=True,
            )
            raise typer.Exit(2) from exc
        raise
    registry = typer.Typer()
    module.register(registry)
    command = typer.main.get_group(registry).commands.get(name)
    if command is None:
        raise LookupError(f"{module_name}.register did not register {name!r}")
    return command


class LazyGroup(TyperGroup):
    """The root group: lists :data:`COMMANDS` from the table, imports a command's module on use."""

    _listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])
        return load_command(cmd_name)

    def format_help(self, ctx: Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="flywheel",
    cls=LazyGroup,
    help="Train the model behind your agent with RL from its own traffic.\n\n"
    "Exit codes: 0 done, 1 the operation failed, 2 the command line is wrong (docs/usage.md#the-command-line).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})


def _print_version(value: bool) -> None:
    """``--version``: what ``flywheel version`` prints, then exit 0 before any command is loaded."""
    if value:
        from flywheel.cli.version_cmd import version_command

        version_command(as_json=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print Flywheel's version and exit (as `flywheel version`).",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Train the model behind your agent with RL from its own traffic."""
    import os

    from infra.logging import configure_logging

    # Log lines go to stderr, so a command's stdout is only its output (`--json` parses), at the level
    # FLYWHEEL_LOG_LEVEL names (as the services' settings read it). A command may configure it again.
    level = (os.environ.get("FLYWHEEL_LOG_LEVEL") or "INFO").upper()
    configure_logging(level if level in _LEVELS else "INFO")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
