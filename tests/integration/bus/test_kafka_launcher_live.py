"""The launcher for real: a second broker on free ports, the bus on it, then the broker stopped under it."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest

import schemas as s
from infra.bus import BusUnavailableError
from infra.bus.kafka import KafkaBus
from infra.kafka import launcher
from tests.integration.bus.helpers import call_event

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_start_publish_stop_then_publish_fails_fast(tmp_path: Path) -> None:
    cfg = launcher.BrokerConfig(port=_free_port(), controller_port=_free_port(), data_dir=tmp_path / "kafka")
    pid = await asyncio.to_thread(launcher.start, cfg, 150.0)
    try:
        assert launcher.read_pid(cfg) == pid
        assert "Kafka Server started" in cfg.log_file.read_text()  # the slf4j binding shows the log
        bus = KafkaBus(cfg.bootstrap, prefix=f"t{uuid.uuid4().hex[:6]}.", publish_timeout_s=3.0)
        await bus.start()
        try:
            await bus.publish(s.EPISODES, call_event(uuid.uuid4().hex, 0, size=300))
            assert await asyncio.to_thread(launcher.stop, cfg)
            assert launcher.read_pid(cfg) is None
            with pytest.raises(BusUnavailableError):
                await bus.publish(s.EPISODES, call_event(uuid.uuid4().hex, 1, size=300))
        finally:
            await bus.stop()
    finally:
        await asyncio.to_thread(launcher.stop, cfg)
    assert not launcher.status(cfg).running
