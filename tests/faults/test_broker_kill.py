"""The fault suite's broker run: ``kill -9`` this test's own Kafka broker under load, then restart it.

The test starts its own broker (``flywheel kafka start`` on free ports: never the shared one) and a
real ``flywheel gateway`` on it; eight agents call through the ``openai`` SDK. The broker is killed
with SIGKILL mid-load; the gateway answers from its spool meanwhile; the broker is started again on
the same data directory and the spool drains. Every call answered 200 must be on the topic once
(after dedup by ``event_id``), with unique ``call_seq`` per episode.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstream import create_fake_upstream
from tests.fakes.waiting import wait_until
from tests.faults.procs import FLYWHEEL, TOKEN, Figures, GatewayProcess, ThreadServer, clean_env, free_port
from tests.faults.test_gateway_restart import Agent, _recorded

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # about a minute with its own broker
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
AGENTS = 8


class OwnBroker:
    def __init__(self, data_dir: Path) -> None:
        self.port, self.controller = free_port(), free_port()
        self.data_dir = data_dir
        self.bootstrap = f"127.0.0.1:{self.port}"

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [FLYWHEEL, "kafka", *args, "--port", str(self.port), "--data-dir", str(self.data_dir)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self) -> None:
        done = self._cli("start", "--controller-port", str(self.controller))
        assert done.returncode == 0, done.stdout + done.stderr

    def kill9(self) -> None:
        os.kill(int((self.data_dir / "kafka.pid").read_text()), signal.SIGKILL)

    def stop(self) -> None:
        self._cli("stop")


def test_broker_kill9_under_load_loses_nothing(tmp_path: Path) -> None:
    broker = OwnBroker(tmp_path / "kafka")
    broker.start()
    prefix = "faults-broker."
    env = clean_env(
        FLYWHEEL_BUS="kafka", FLYWHEEL_KAFKA_BOOTSTRAP=broker.bootstrap, FLYWHEEL_TOPIC_PREFIX=prefix
    )
    # while the broker is down a publish fails after 3 s and the call is spooled (then answered 200)
    env["FLYWHEEL_PUBLISH_TIMEOUT_S"] = "3"
    stop = threading.Event()
    agents: list[Agent] = []
    try:
        with ThreadServer(create_fake_upstream()) as upstream:
            gw = GatewayProcess(upstream.url, tmp_path / "gw", env, tmp_path / "gateway.log")
            gw.start()
            gw.wait_ready()
            try:
                with httpx.Client(timeout=10, headers=ADMIN) as admin:
                    urls = [
                        admin.post(f"{gw.url}/admin/episodes", json={}).json()["base_url"]
                        for _ in range(AGENTS)
                    ]
                    agents = [Agent(url, stop) for url in urls]
                    for agent in agents:
                        agent.start()
                    total = lambda: sum(len(a.answered) for a in agents)  # noqa: E731
                    asyncio.run(
                        wait_until(lambda: total() >= 80, 60, "calls before the kill", interval_s=0.02)
                    )
                    broker.kill9()
                    killed, at_kill = time.monotonic(), total()
                    asyncio.run(
                        wait_until(
                            lambda: total() >= at_kill + 40,
                            60,
                            "calls answered from the spool",
                            interval_s=0.02,
                        )
                    )
                    down_calls = total() - at_kill
                    broker.start()
                    restarted = time.monotonic()
                    asyncio.run(
                        wait_until(
                            lambda: admin.get(f"{gw.url}/admin/state").json().get("spool_depth") == 0,
                            90,
                            "the spool drained",
                            interval_s=0.02,
                        )
                    )
                    drained_s = time.monotonic() - restarted
                    down_s = restarted - killed
            finally:
                stop.set()
                for agent in agents:
                    agent.join(15)
                gw.stop()
        answered = {cid for a in agents for cid in a.answered}
        calls = asyncio.run(_recorded(broker.bootstrap, prefix, answered))
    finally:
        broker.stop()
    unique = list({c.event_id: c for c in calls}.values())
    lost = answered - {c.call_id for c in unique}
    per_call = Counter(c.call_id for c in unique)
    duplicates = sum(n - 1 for n in per_call.values())
    pairs = Counter((c.episode_id, c.call_seq) for c in unique)
    reused = sum(1 for n in pairs.values() if n > 1)
    figures = Figures(
        "broker_kill9",
        calls=len(answered),
        ok=len(answered),
        lost=len(lost),
        duplicates=duplicates,
        server_errors=sum(a.server_errors for a in agents),
        recover_s=round(drained_s, 2),
        extra={"answered_while_down": down_calls, "broker_down_s": round(down_s, 2), "reused_seq": reused},
    )
    figures.report()
    assert not lost and duplicates == 0 and reused == 0, figures
    assert figures.server_errors == 0 and down_calls >= 40
