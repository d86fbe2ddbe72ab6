"""``flywheel kafka start|stop|status``: a local single-node Kafka broker (see infra/kafka/launcher.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flywheel.cli.common import JSON_HELP, fail, print_json
from infra.kafka.launcher import BrokerConfig, KafkaLauncherError, start, status, stop

kafka_app = typer.Typer(help="Run a local single-node Kafka (KRaft) broker from Maven Central jars.")

Port = Annotated[int, typer.Option("--port", help="client port on 127.0.0.1")]
ControllerPort = Annotated[int | None, typer.Option("--controller-port", help="default: port + 1")]
AsJson = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="default: ~/.cache/flywheel/kafka-data/<port>")
]


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")


@kafka_app.command("start")
def start_command(
    port: Port = 9092,
    controller_port: ControllerPort = None,
    data_dir: DataDir = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the broker")] = 90.0,
    as_json: AsJson = False,
) -> None:
    """Start the broker (fetching the jars once) and wait until it accepts clients."""
    cfg = BrokerConfig(port=port, controller_port=controller_port, data_dir=data_dir)
    try:
        pid = start(cfg, timeout_s=timeout)
    except KafkaLauncherError as exc:
        fail(str(exc))
    if as_json:
        print_json(
            {"bootstrap": cfg.bootstrap, "pid": pid, "data_dir": str(cfg.dir), "log": str(cfg.log_file)}
        )
        return
    typer.echo(f"kafka running on {cfg.bootstrap} (pid {pid}, data {cfg.dir}, log {cfg.log_file})")


@kafka_app.command("stop")
def stop_command(port: Port = 9092, data_dir: DataDir = None, as_json: AsJson = False) -> None:
    """Stop the broker started for this port / data dir."""
    cfg = BrokerConfig(port=port, data_dir=data_dir)
    stopped = stop(cfg)
    if as_json:
        print_json({"bootstrap": cfg.bootstrap, "data_dir": str(cfg.dir), "stopped": stopped})
        return
    typer.echo(f"kafka on {cfg.bootstrap} stopped" if stopped else f"no kafka running from {cfg.dir}")


@kafka_app.command("status")
def status_command(port: Port = 9092, data_dir: DataDir = None, as_json: AsJson = False) -> None:
    """Say whether the broker runs and answers clients (exit 1 when it does not; --json prints it too)."""
    st = status(BrokerConfig(port=port, data_dir=data_dir))
    if as_json:
        print_json(
            {
                "running": st.running,
                "ready": st.ready,
                "pid": st.pid,
                "bootstrap": st.bootstrap,
                "data_dir": str(st.data_dir),
            }
        )
        if not st.ready:
            raise typer.Exit(1)
        return
    if not st.running:
        fail(f"no kafka running from {st.data_dir}")
    if not st.ready:
        fail(f"kafka (pid {st.pid}) runs but does not answer on {st.bootstrap}")
    typer.echo(f"kafka running on {st.bootstrap} (pid {st.pid}, data {st.data_dir})")
