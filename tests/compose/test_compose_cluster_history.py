"""The compose cluster up on a real Docker engine, four kills under load, then the history checker.

``docker-compose -f docker-compose.yml -f docker-compose.cluster.yml --profile cpu up``: three Kafka
brokers (RF=3, min ISR 2), two gateways behind the one address ``gateway``, two workers, two reward
services, the embedded engine on a tiny model, the trainer and the chdb recorder, each a container from
the images infra/scripts/build_images.sh builds. The workers run the ``openai``-SDK chat agent
(examples/agents_for_tests/chat_agent.py, mounted as the user's agent folder) with the SDK's retries on
and every HTTP attempt logged to a mounted folder. Waves of tasks go in with ``flywheel tasks submit``;
during the waves the test ``docker kill``s, one after another, the broker leading the busiest partition
of ``flywheel.episodes``, ``gateway-2``, ``worker-2`` and ``reward-2``, and starts each again. Then a
one-off container on the stack's network (tests/compose/cluster_log.py) reads ``flywheel.episodes`` and
``flywheel.transitions`` whole and the trainer's committed offsets, and ``tests/faults/history.py`` checks
them with the agents' attempts: every call recorded once, every finished episode scored once and from
all its calls, every scored episode below the trainer's committed offset, no 5xx outside the retry path.

Calls of one episode that reached both gateways (a connection to the killed one re-resolved to the
other) are numbered by each gateway on its own, so their numbers can repeat; the reward service orders
them (docs/operating.md, "Gateway replicas"). Such episodes are counted, not failed.

5 to 11 minutes on two cores, so on demand: ``FLYWHEEL_COMPOSE_CLUSTER=1 python -m pytest -s
tests/compose/test_compose_cluster_history.py`` (a Docker engine: infra/scripts/docker_engine.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from infra.eventlog.client import HttpEventLogReader
from schemas import decode
from tests.compose.test_compose_stack import (
    CORPUS,
    ENGINE_COMMAND,
    MODEL_CACHE,
    REPO,
    Stack,
    _docker,
    _healthy,
    _images,
    _port,
    _ready,
    _unavailable,
)
from tests.faults.history import Logged, check
from tests.faults.procs import Figures
from tests.faults.test_cluster_history import _attempts

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        os.environ.get("FLYWHEEL_COMPOSE_CLUSTER") != "1",
        reason="5 to 11 minutes: FLYWHEEL_COMPOSE_CLUSTER=1 runs it (every run: tests/faults/test_cluster_history.py)",
    ),
]

TOKEN = "compose-cluster-admin-token-0123456789abcdef"
FILES = [REPO / "infra" / "docker-compose.yml", REPO / "infra" / "docker-compose.cluster.yml"]
AGENT_DIR = REPO / "examples" / "agents_for_tests"
AGENT = "python /agent/chat_agent.py"
TASKS_PER_WAVE = 8
SAMPLES = 2
WAVES = 5
BROKERS = {1: "kafka", 2: "kafka-2", 3: "kafka-3"}
SERVICES = {"kafka", "kafka-2", "kafka-3", "engine", "gateway", "gateway-2", "worker", "worker-2", "reward"}
SERVICES |= {"reward-2", "trainer-cpu", "recorder-chdb"}


def _override(tmp: Path, attempts: Path) -> Path:
    """The user's additions: the agent folder and an attempts folder in both workers, a tiny engine."""
    volumes = [f"{AGENT_DIR}:/agent:ro", f"{attempts}:/attempts"]
    agent_env = {"CHAT_AGENT_CALL_LOG": "/attempts/attempts.jsonl", "CHAT_AGENT_MAX_RETRIES": "8"}
    worker = {"volumes": volumes, "environment": agent_env}
    gateway = {"environment": {"FLYWHEEL_PUBLISH_TIMEOUT_S": "3"}}
    override = {
        "services": {
            "worker": worker,
            # worker-2's agents on gateway-2, so its kill meets calls in flight (the overlay's default:
            # both workers on the one address `gateway`, which docker's DNS answers with either)
            "worker-2": {
                "volumes": volumes,
                "environment": {**agent_env, "FLYWHEEL_GATEWAY_URL": "http://gateway-2:8100"},
            },
            "gateway": gateway,
            "gateway-2": gateway,
            "engine": {"command": ENGINE_COMMAND.split(), "environment": {"OMP_NUM_THREADS": "1"}},
            "trainer-cpu": {
                "environment": {
                    "FLYWHEEL_TRAINER_BATCH_GROUPS": "2",
                    "FLYWHEEL_TRAINER_GROUP_TIMEOUT_S": "60",
                    "FLYWHEEL_TRAINER_TORCH_THREADS": "1",
                    "OMP_NUM_THREADS": "1",
                }
            },
        },
    }
    path = tmp / "docker-compose.test.yml"
    path.write_text(yaml.safe_dump(override))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    from trainer.models.tiny import build_tiny

    tmp = tmp_path_factory.mktemp("compose-cluster")
    model = build_tiny(MODEL_CACHE, CORPUS, vocab_size=320, hidden=64, layers=2)
    models = tmp / "models"
    shutil.copytree(model, models / "policy")
    attempts = tmp / "attempts"
    attempts.mkdir()
    for path in [attempts, *models.rglob("*")]:  # the services run as an unprivileged user (uid 10001)
        path.chmod(0o777 if path == attempts else 0o755 if path.is_dir() else 0o644)
    (tmp / "out").mkdir()
    (tmp / "out").chmod(0o777)
    shutil.copy(REPO / "tests" / "compose" / "cluster_log.py", tmp / "out" / "cluster_log.py")
    gateway_port, recorder_port = _port(), _port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "COMPOSE_"))},
        **_images(),
        "FLYWHEEL_ADMIN_TOKEN": TOKEN,
        "FLYWHEEL_MODELS_DIR": str(models),
        "FLYWHEEL_TRAINER_ENGINE_KIND": "flywheel",
        "FLYWHEEL_EPISODE_KEY": "compose-cluster-episode-key-0123",
        "FLYWHEEL_GATEWAY_PORT": str(gateway_port),
        "FLYWHEEL_RECORDER_PORT": str(recorder_port),
    }
    files = [arg for f in [*FILES, _override(tmp, attempts)] for arg in ("-f", str(f))]
    stack = Stack(
        project=f"flywheel-cluster-{uuid.uuid4().hex[:8]}",
        tmp=tmp,
        env=env,
        files=files,
        gateway=f"http://127.0.0.1:{gateway_port}",
        recorder=f"http://127.0.0.1:{recorder_port}",
    )
    try:
        up = stack.compose("up", "-d", "--no-build", timeout=1200)
        assert up.returncode == 0, up.stderr[-3000:] + stack.logs()
        yield stack
    finally:
        down = stack.compose("down", "-v", "--remove-orphans", "--timeout", "20")
        assert down.returncode == 0, down.stderr[-2000:]


def _wait(stack: Stack, what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    pytest.fail(f"{what} not reached in {timeout_s:.0f} s:\n{stack.logs()}")


def _submit(stack: Stack, wave: int) -> None:
    path = stack.tmp / f"tasks-{wave}.jsonl"
    tasks = [
        {
            "task_id": f"w{wave}-{i}",
            "input": {"question": f"{i} plus {wave}?", "calls": 4, "pause": 1.0, "reward": float(i % 2)},
        }
        for i in range(TASKS_PER_WAVE)
    ]
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    path.chmod(0o644)
    done = stack.compose(
        "run", "--rm", "-T", "--no-deps", "-v", f"{path}:/tasks.jsonl:ro", "topics",
        "tasks", "submit", "/tasks.jsonl", "--agent", AGENT, "--n", str(SAMPLES), "--deadline", "180",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-2000:]


def _from_kafka(stack: Stack, what: str) -> dict[str, object]:
    """tests/compose/cluster_log.py in a one-off container on the stack's network."""
    out = stack.tmp / "out"
    run = stack.compose(
        "run", "--rm", "-T", "--no-deps", "-v", f"{out}:/out", "--entrypoint", "python", "topics",
        "/out/cluster_log.py", what, f"/out/{what}.json",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-3000:]
    result: dict[str, object] = json.loads((out / f"{what}.json").read_text())
    return result


def _quiet(path: Path, for_s: float) -> Callable[[], bool]:
    """A check that holds once ``path`` has not grown for ``for_s`` seconds."""
    seen = {"size": -1, "since": time.monotonic()}

    def check() -> bool:
        size = path.stat().st_size if path.exists() else 0
        if size != seen["size"]:
            seen.update(size=size, since=time.monotonic())
        return time.monotonic() - seen["since"] >= for_s

    return check


def _history(stack: Stack) -> tuple[list[Logged], dict[int, int], int]:
    log = _from_kafka(stack, "log")
    records = log["records"]
    assert isinstance(records, list)
    logged = [
        Logged(decode(r["topic"], json.dumps(r["event"])), r["topic"], r["partition"], r["offset"])
        for r in records
    ]
    committed = log["trainer_committed"]
    assert isinstance(committed, dict)
    lag = log["trainer_lag"]
    assert isinstance(lag, int)
    return logged, {int(p): int(o) for p, o in committed.items()}, lag


def test_the_compose_cluster_survives_four_kills_and_its_history_checks(cluster: Stack) -> None:
    stack = cluster
    _wait(stack, "the gateway's readiness", lambda: _ready(f"{stack.gateway}/readyz"), 600)
    _wait(stack, "the engine's health", lambda: _healthy(stack, "engine"), 600)
    _wait(stack, "the recorder's health", lambda: _ready(f"{stack.recorder}/healthz"), 300)
    reader = HttpEventLogReader(stack.recorder, TOKEN)

    def scores() -> int:
        try:
            return reader.counts().by_type.get("episode_scored", 0)
        except httpx.HTTPError:
            return -1

    def above(n: int) -> Callable[[], bool]:
        return lambda: scores() > n

    def kill(service: str) -> None:
        container = stack.compose("ps", "-q", service).stdout.strip()
        killed = subprocess.run([_docker(), "kill", container], capture_output=True, text=True, timeout=60)
        assert killed.returncode == 0, killed.stderr

    recover: dict[str, float] = {}
    try:
        _submit(stack, 0)
        _wait(stack, "the first scores", lambda: scores() >= 2, 600)
        for wave, name in enumerate(("broker", "gateway", "worker", "reward"), start=1):
            base = max(scores(), 0)
            _submit(stack, wave)
            _wait(stack, f"a score before killing the {name}", above(base), 300, 0.5)
            if name == "broker":
                leaders = _from_kafka(stack, "leaders")
                service = BROKERS[int(str(leaders["leader"]))]
            else:
                service = f"{name}-2"
            at_kill, killed_at = max(scores(), 0), time.monotonic()
            kill(service)
            time.sleep(1.0)
            started = stack.compose("start", service)
            assert started.returncode == 0, started.stderr
            _wait(stack, f"a score after killing {service}", above(at_kill), 300, 0.2)
            recover[name] = round(time.monotonic() - killed_at, 2)
        episodes = WAVES * TASKS_PER_WAVE * SAMPLES
        _wait(stack, f"{episodes} episodes scored in the recorder", lambda: scores() >= episodes, 600)
    finally:
        reader.close()

    attempts = stack.tmp / "attempts" / "attempts.jsonl"
    _wait(stack, "the agents quiet for 30 s", _quiet(attempts, 30.0), 900, 5.0)  # re-delivered tasks too
    deadline = time.monotonic() + 300
    while True:  # the trainer and the last scores catch up
        logged, committed, lag = _history(stack)
        violations, history = check(logged, _attempts(attempts), committed)
        if (not violations and lag == 0) or time.monotonic() > deadline:
            break
        time.sleep(10)
    logs = stack.compose("logs", "--no-color", timeout=180).stdout
    repeated = {v.episode_id for v in violations if v.rule == "call-seq-unique"}
    others = [v for v in violations if v.rule != "call-seq-unique"]
    figures = Figures(
        "compose_cluster_history",
        calls=history.calls_recorded,
        ok=history.calls_recorded,
        lost=sum(1 for v in others if v.rule != "no-5xx"),
        server_errors=history.violations.get("no-5xx", 0),
        extra={
            "kills": 4,
            "client_calls": history.client_calls,
            "retried_calls": history.retried_calls,
            "duplicate_records": history.duplicate_records,
            "episodes_requested": WAVES * TASKS_PER_WAVE * SAMPLES,
            "episodes_finished": history.episodes_finished,
            "episodes_scored": history.episodes_scored,
            "episodes_renumbered": len(repeated),
            "trainer_lag": lag,
            "partition_assignments": logs.count('"bus.partitions_assigned"'),
            "commits_refused": logs.count("CommitFailedError"),
            **{f"{k}_kill_to_next_score_s": v for k, v in recover.items()},
        },
    )
    figures.report()
    assert others == [], (others[:10], figures)
    assert lag == 0
    assert history.episodes_finished >= WAVES * TASKS_PER_WAVE * SAMPLES
    ps = stack.compose("ps", "--services", "--filter", "status=running")
    assert set(ps.stdout.split()) >= SERVICES, ps.stdout
