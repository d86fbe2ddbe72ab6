"""The local Kafka launcher's pieces that need no JVM: config, pid checks, one-line CLI errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.kafka import launcher
from infra.kafka.launcher import BrokerConfig, _properties, kafka_version, read_pid


def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    cfg = BrokerConfig(port=19092, data_dir=tmp_path)
    props = dict(line.split("=", 1) for line in _properties(cfg).splitlines())
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["process.roles"] == "broker,controller"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == str(tmp_path.resolve() / "logs")
    assert BrokerConfig(port=1, controller_port=5).cport == 5
    assert kafka_version().startswith("4.")


def test_stale_pid_file_is_not_a_running_broker(tmp_path: Path) -> None:
    cfg = BrokerConfig(port=19092, data_dir=tmp_path)
    cfg.pid_file.write_text("1\n")  # pid 1 exists but is not our Kafka
    assert read_pid(cfg) is None


def test_cli_start_on_a_busy_port_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = CliRunner().invoke(app, ["kafka", "start", "--port", str(port), "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: port {port} on 127.0.0.1 is already in use by another process"


def test_cli_status_and_stop_without_a_broker(tmp_path: Path) -> None:
    runner = CliRunner()
    status = runner.invoke(app, ["kafka", "status", "--port", "19999", "--data-dir", str(tmp_path)])
    assert status.exit_code == 1 and "no kafka running" in status.output
    stop = runner.invoke(app, ["kafka", "stop", "--port", "19999", "--data-dir", str(tmp_path)])
    assert stop.exit_code == 0 and "no kafka running" in stop.output


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-storage reads a ``-t`` value starting with "-" as an option: such an id is drawn again."""
    import uuid

    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(launcher.uuid, "uuid4", lambda: next(drawn))
    assert launcher._random_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


def test_server_properties_of_a_three_node_cluster(tmp_path: Path) -> None:
    """Every node votes in one controller quorum; topics get RF=3 and min.insync.replicas=2."""
    nodes = launcher.cluster(3, 29092, tmp_path)
    props = [dict(line.split("=", 1) for line in _properties(cfg).splitlines()) for cfg in nodes]
    voters = "1@127.0.0.1:29093,2@127.0.0.1:29095,3@127.0.0.1:29097"
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in props} == {voters}
    assert props[1]["listeners"] == "PLAINTEXT://127.0.0.1:29094,CONTROLLER://127.0.0.1:29095"
    for p in props:
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"
    assert len({cfg.dir for cfg in nodes}) == 3
    assert launcher.cluster(1, 29092, tmp_path)[0].replicas == 1
