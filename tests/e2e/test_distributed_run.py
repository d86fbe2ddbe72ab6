"""The distributed runtime end to end: every service its own `flywheel` process on the real Kafka broker.

`flywheel engine` (a tiny model built here) ← `flywheel gateway` ← `flywheel worker` (a command agent
using the real ``openai`` SDK) → `flywheel reward` → `flywheel trainer run` (sync mode, weights loaded
into the engine over HTTP) and `flywheel recorder` writing every event to its own embedded ClickHouse.
The test submits tasks with `flywheel tasks submit`, waits for a training step and a new weight version
on the control topic, checks the recorder has everything, and asks `flywheel status` about the lot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest

from infra.bus.base import Message
from infra.bus.kafka import KafkaBus
from infra.eventlog.client import HttpEventLogReader
from schemas import CONTROL, TrainerStepCompleted, WeightsActivated, WeightUpdateFailed

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "distributed-run-admin-token-0123456789"
MODEL_CACHE = Path.home() / ".cache" / "flywheel" / "models" / "ops-e2e-tiny"
CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(12) for b in range(12)]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Cluster:
    tmp: Path
    env: dict[str, str]
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    logs: dict[str, IO[bytes]] = field(default_factory=dict)

    async def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        self.logs[name] = log
        data_dir = self.tmp / name
        self.procs[name] = await asyncio.create_subprocess_exec(
            FLYWHEEL,
            *args,
            cwd=REPO,
            env={**self.env, "FLYWHEEL_DATA_DIR": str(data_dir), **(env or {})},
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.returncode is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    async def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                codes[name] = await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                codes[name] = None  # did not stop on SIGTERM
        for log in self.logs.values():
            log.close()
        return codes


async def _wait_http(cluster: Cluster, name: str, url: str, timeout_s: float = 120) -> None:
    async with httpx.AsyncClient(timeout=2) as client, asyncio.timeout(timeout_s):
        while True:
            cluster.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code < 400:
                    return
            await asyncio.sleep(0.3)


async def _run_cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        FLYWHEEL, *args, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def cluster(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")},
        "PYTHONPATH": str(REPO),
        "FLYWHEEL_BUS": "kafka",
        "FLYWHEEL_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "FLYWHEEL_TOPIC_PREFIX": topic_prefix,
        "FLYWHEEL_ADMIN_TOKEN": TOKEN,
        "FLYWHEEL_LOG_JSON": "true",
        # the worker signs episode URLs; the gateway admits them without reading flywheel.episodes
        "FLYWHEEL_EPISODE_KEY": "distributed-test-episode-key",
    }
    c = Cluster(tmp_path, env)
    yield c
    codes = await c.stop()
    hung = [name for name, code in codes.items() if code is None]
    assert not hung, f"did not stop on SIGTERM: {hung}"


async def test_distributed_training_loop(cluster: Cluster, kafka_bootstrap: str, topic_prefix: str) -> None:
    from trainer.models.tiny import build_tiny

    model = await asyncio.to_thread(build_tiny, MODEL_CACHE, CORPUS, vocab_size=320, hidden=64, layers=2)
    env = cluster.env
    code, out, err = await _run_cli(env, "topics", "create")
    assert code == 0, err

    engine_port, gateway_port, recorder_port = _port(), _port(), _port()
    engine = f"http://127.0.0.1:{engine_port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    recorder = f"http://127.0.0.1:{recorder_port}"
    await cluster.spawn("recorder", "recorder", "--port", str(recorder_port))
    await cluster.spawn(
        "engine", "engine", "--model", str(model), "--port", str(engine_port), "--served-model-name", "policy",
        "--threads", "1",
    )  # fmt: skip
    await cluster.spawn(
        "gateway", "gateway", "--upstream", f"{engine}/v1", "--kind", "vllm", "--port", str(gateway_port)
    )
    await cluster.spawn("reward", "reward")
    await cluster.spawn(
        "trainer",
        "trainer",
        "run",
        env={
            "FLYWHEEL_TRAINER_BASE_MODEL": str(model),
            "FLYWHEEL_TRAINER_ENGINE_URL": engine,
            "FLYWHEEL_TRAINER_MODE": "sync",
            "FLYWHEEL_TRAINER_BATCH_GROUPS": "2",
            "FLYWHEEL_TRAINER_GROUP_TIMEOUT_S": "90",
            "FLYWHEEL_TRAINER_TORCH_THREADS": "1",
        },
    )
    await cluster.spawn("worker", "worker", "--gateway", gateway, "--concurrency", "4")

    control: list[object] = []
    activated = asyncio.Event()

    async def on_control(message: Message) -> None:
        control.append(message.event)
        if isinstance(message.event, WeightUpdateFailed):
            activated.set()  # a failed load ends the wait too: the test reports it below
        new_weights = any(isinstance(e, WeightsActivated) and e.version >= 1 for e in control)
        if new_weights and any(isinstance(e, TrainerStepCompleted) for e in control):
            activated.set()

    bus = KafkaBus(kafka_bootstrap, prefix=topic_prefix)
    await bus.start()
    sub = await bus.subscribe(CONTROL, "test-observer", on_control, from_beginning=True)
    try:
        await _wait_http(cluster, "engine", f"{engine}/v1/models")
        await _wait_http(cluster, "gateway", f"{gateway}/readyz")
        await _wait_http(cluster, "recorder", f"{recorder}/healthz")

        tasks = cluster.tmp / "tasks.jsonl"
        scorer = {"name": "function", "ref": "tests.e2e.ops_scorers:alternating"}
        tasks.write_text(
            "".join(
                json.dumps(
                    {
                        "task_id": f"sum-{i}",
                        "input": {"question": f"What is {i} plus 2?", "calls": 2},
                        "scorer": scorer,
                    }
                )
                + "\n"
                for i in range(2)
            )
        )
        agent = f"{sys.executable} examples/agents_for_tests/chat_agent.py"
        code, out, err = await _run_cli(
            env, "tasks", "submit", str(tasks), "--agent", agent, "--n", "4", "--deadline", "120"
        )
        assert code == 0, err

        try:
            async with asyncio.timeout(200):
                while not activated.is_set():
                    cluster.check_alive()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(activated.wait(), 1.0)
        except TimeoutError:
            logs = "\n".join(
                f"--- {n}\n{cluster.tail(n, 1500)}" for n in ("trainer", "reward", "worker", "gateway")
            )
            pytest.fail(f"no new weight version; control events: {control}\n{logs}")
    finally:
        await sub.stop()
        await bus.stop()

    failed = [e for e in control if isinstance(e, WeightUpdateFailed)]
    assert not failed, f"the trainer could not load its new weights into the engine: {failed[0].error}"
    steps = [e for e in control if isinstance(e, TrainerStepCompleted)]
    assert steps and steps[0].version >= 1

    # The gateway serves the new version; the recorder has the whole run in its embedded ClickHouse.
    async with httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        state = (await client.get(f"{gateway}/admin/state")).json()
    assert state["weight_version"] >= 1 and state["paused"] is False
    # An episode's events come from three services (gateway, worker, reward) and two recorder consumers
    # share the episodes topic, so its calls may land after its score: wait for every count.
    wanted = {"weights_activated": 1, "episode_scored": 8, "episode_finished": 8, "llm_call_recorded": 16}
    counts: dict[str, int] = {}
    reader = HttpEventLogReader(recorder, TOKEN)
    try:
        async with asyncio.timeout(30):
            while any(counts.get(kind, 0) < n for kind, n in wanted.items()):
                await asyncio.sleep(0.3)
                counts = (await asyncio.to_thread(reader.counts)).by_type
    except TimeoutError:
        pytest.fail(f"the event log is missing events after 30 s: {counts} (wanted at least {wanted})")
    finally:
        reader.close()

    # `flywheel status` against Kafka sees every consumer service and the new weights.
    code, out, err = await _run_cli({**env, "FLYWHEEL_GATEWAY_URL": gateway}, "status", "--json")
    status = json.loads(out)
    assert code == 0, (status["problems"], err)
    assert all(status["services"][s]["up"] for s in ("worker", "reward", "trainer", "recorder"))
    assert status["control"]["weight_version"] >= 1 and status["control"]["trainer_step"] >= 1
    assert status["gateway"]["weight_version"] >= 1
    assert status["gateway"]["episode_admission"] == "ticket"  # it never subscribed to flywheel.episodes
