"""`docker-compose --profile cpu up` of infra/docker-compose.yml on a real Docker engine, driven from the host.

infra/scripts/build_images.sh builds the images from packages (a debootstrap base, Flywheel's image,
a Kafka image standing in for apache/kafka); compose starts Kafka, the topics job, the embedded engine
on a tiny model, the gateway, worker, reward service, the chdb recorder and the trainer as containers.
The test then does what the docs tell a user to do: submits tasks with `flywheel tasks submit` in a
one-off container on the stack's network, a command agent in the worker container calls the gateway
container (an OpenAI SDK agent: the user's agent folder is the one thing mounted, the SDK is in the
image), the reward service scores each episode with a built-in scorer, the trainer steps and the engine
container activates the new weights (the gateway's admin state says so), and the recorder's admin API
(published port) returns the recorded events. Then, on the same stack, the fault suite's accounting
(tests/faults/test_broker_kill.py) with containers: agents on the host call the gateway while
`docker kill` takes the broker container down and `docker-compose restart gateway` restarts the
gateway; every call answered 200 is in the event log once after dedup by ``event_id``. (The test runs
docker-compose v1, Debian's; `docker compose` v2 takes the same arguments, as docs/operating.md says.)

The engine comes from infra/scripts/docker_engine.sh (the test command starts it and exports
DOCKER_HOST). No engine: skipped, except with CI=true, where it is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from infra.eventlog.client import HttpEventLogReader

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "infra" / "docker-compose.yml"
TOKEN = "compose-stack-admin-token-0123456789abcdef"
MODEL_CACHE = Path.home() / ".cache" / "flywheel" / "models" / "ops-e2e-tiny"
CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(12) for b in range(12)]
AGENTS = 4  # host-side agents of the fault run
AGENT_DIR = REPO / "examples" / "compose_agent"  # the user's agent folder, mounted into the worker as /agent
AGENT = "python /agent/agent.py"
# A built-in scorer that gives a random model's groups varied rewards (a real model: `numeric` against the
# task's answer): an even-length answer scores 1, about half of the tiny model's replies. Zero variance in
# a group of 8 has odds 1/128, in both groups of the batch (no training step) 1/16384.
SCORER = {"name": "regex", "options": {"pattern": "(?s)(..)*", "full": True}}
ROLLOUTS = 8
# the compose file's engine command, on one torch thread (two shared cores)
ENGINE_COMMAND = (
    "engine --model /models/policy --served-model-name policy --host 0.0.0.0 --port 8000 --threads 1"
)


def _docker() -> str:
    """The docker CLI to use: Debian's (the engine's own version) before a newer client on PATH."""
    return os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")


def _unavailable() -> str | None:
    """Why this machine cannot run the stack, or None."""
    if shutil.which("docker-compose") is None:
        return "docker-compose is not installed (infra/scripts/docker_engine.sh start installs it)"
    try:
        proc = subprocess.run(
            [_docker(), "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker: {exc}"
    if proc.returncode != 0:
        return f"no Docker engine answers at {os.environ.get('DOCKER_HOST', 'the default socket')}"
    return None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Stack:
    project: str
    tmp: Path
    env: dict[str, str]
    files: list[str]
    gateway: str
    recorder: str

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker-compose", "-p", self.project, *self.files, "--profile", "cpu", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def logs(self, *services: str, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, timeout=60).stdout


def _images() -> dict[str, str]:
    """FLYWHEEL_IMAGE, FLYWHEEL_TRAIN_IMAGE and FLYWHEEL_KAFKA_IMAGE from build_images.sh (cached: seconds)."""
    proc = subprocess.run(
        ["bash", "infra/scripts/build_images.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def _override(tmp: Path) -> Path:
    """What a user adds for this run: their agent folder mounted in, a trainer that steps on 2 groups."""
    override = {
        "services": {
            "worker": {"volumes": [f"{AGENT_DIR}:/agent:ro"]},
            # while the broker is down a publish fails after 3 s and the call is spooled (then answered)
            "gateway": {"environment": {"FLYWHEEL_PUBLISH_TIMEOUT_S": "3"}},
            "engine": {
                "command": ENGINE_COMMAND.split(),
                "environment": {"OMP_NUM_THREADS": "1"},
            },
            "trainer-cpu": {
                "environment": {
                    "FLYWHEEL_TRAINER_MODE": "sync",
                    "FLYWHEEL_TRAINER_BATCH_GROUPS": "2",
                    "FLYWHEEL_TRAINER_GROUP_TIMEOUT_S": "90",
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
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; with CI=true this is a failure", pytrace=False)
        pytest.skip(reason)
    from trainer.models.tiny import build_tiny

    tmp_path = tmp_path_factory.mktemp("compose")

    model = build_tiny(MODEL_CACHE, CORPUS, vocab_size=320, hidden=64, layers=2)
    models = tmp_path / "models"
    shutil.copytree(model, models / "policy")
    for path in models.rglob("*"):  # the services run as an unprivileged user (uid 10001)
        path.chmod(0o755 if path.is_dir() else 0o644)
    gateway_port, recorder_port = _port(), _port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "COMPOSE_"))},
        **_images(),
        "FLYWHEEL_ADMIN_TOKEN": TOKEN,
        "FLYWHEEL_MODELS_DIR": str(models),
        "FLYWHEEL_TRAINER_ENGINE_KIND": "flywheel",
        "FLYWHEEL_EPISODE_KEY": "compose-stack-episode-key",
        "FLYWHEEL_GATEWAY_PORT": str(gateway_port),
        "FLYWHEEL_RECORDER_PORT": str(recorder_port),
    }
    files = ["-f", str(COMPOSE_FILE), "-f", str(_override(tmp_path))]
    s = Stack(
        project=f"flywheel-test-{uuid.uuid4().hex[:8]}",
        tmp=tmp_path,
        env=env,
        files=files,
        gateway=f"http://127.0.0.1:{gateway_port}",
        recorder=f"http://127.0.0.1:{recorder_port}",
    )
    try:
        up = s.compose("up", "-d", "--no-build")
        assert up.returncode == 0, up.stderr[-3000:] + s.logs()
        yield s
    finally:
        down = s.compose("down", "-v", "--remove-orphans", "--timeout", "20")
        assert down.returncode == 0, down.stderr[-2000:]


def _wait(stack: Stack, what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(1.0)
    pytest.fail(f"{what} not reached in {timeout_s:.0f} s:\n{stack.logs()}")


def _admin_state(stack: Stack) -> dict[str, object] | None:
    try:
        resp = httpx.get(
            f"{stack.gateway}/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
        )
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    state: dict[str, object] = resp.json()
    return state


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code < 400
    except httpx.HTTPError:
        return False


def _healthy(stack: Stack, service: str) -> bool:
    """The service's container passes its compose health check."""
    container = stack.compose("ps", "-q", service, timeout=60).stdout.strip()
    if not container:
        return False
    status = subprocess.run(
        [_docker(), "inspect", "--format", "{{.State.Health.Status}}", container],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return status.stdout.strip() == "healthy"


def test_the_cpu_profile_trains_from_the_host(stack: Stack) -> None:
    _wait(stack, "the gateway's readiness", lambda: _ready(f"{stack.gateway}/readyz"), 300)
    # the engine serves the model (its health check) before the agents call it
    _wait(stack, "the engine's health", lambda: _healthy(stack, "engine"), 300)
    _wait(stack, "the recorder's health", lambda: _ready(f"{stack.recorder}/healthz"), 120)

    tasks = stack.tmp / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {"task_id": f"sum-{i}", "input": {"question": f"What is {i} plus 2?"}, "scorer": SCORER}
            )
            + "\n"
            for i in range(2)
        )
    )
    submit = stack.compose(
        "run", "--rm", "-T", "--no-deps", "-v", f"{tasks}:/tasks.jsonl:ro", "topics",
        "tasks", "submit", "/tasks.jsonl", "--agent", AGENT, "--n", str(ROLLOUTS), "--deadline", "120",
        "--json",
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert json.loads(submit.stdout)["published"] == 2 * ROLLOUTS

    def trained() -> bool:
        state = _admin_state(stack)
        version = state.get("weight_version") if state else None
        return isinstance(version, int) and version >= 1

    _wait(stack, "a new weight version in the engine container", trained, 600)

    # 2 tasks x 8 rollouts, one call each: every event recorded in chdb on the recorder's volume
    episodes = 2 * ROLLOUTS
    wanted = {
        "weights_activated": 1,
        "episode_scored": episodes,
        "episode_finished": episodes,
        "llm_call_recorded": episodes,
    }
    reader = HttpEventLogReader(stack.recorder, TOKEN)
    counts: dict[str, int] = {}
    try:

        def recorded() -> bool:
            nonlocal counts
            counts = reader.counts().by_type
            return all(counts.get(kind, 0) >= n for kind, n in wanted.items())

        _wait(stack, f"the recorded events {wanted}", recorded, 120)
    finally:
        reader.close()
    ps = stack.compose("ps", "--services", "--filter", "status=running")
    running = set(ps.stdout.split())
    assert {"kafka", "engine", "gateway", "worker", "reward", "recorder-chdb", "trainer-cpu"} <= running, (
        ps.stdout
    )


def _wait_for(stack: Stack, what: str, check: object, timeout_s: float) -> float:
    """Seconds until ``check()`` held (polled every 0.1 s)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if callable(check) and check():
            return time.monotonic() - start
        time.sleep(0.1)
    pytest.fail(f"{what} not reached in {timeout_s:.0f} s:\n{stack.logs('gateway', 'kafka')}")


def test_a_broker_kill_and_a_gateway_restart_lose_nothing(stack: Stack) -> None:
    from tests.faults.procs import Figures
    from tests.faults.test_gateway_restart import Agent

    _wait(stack, "the gateway's readiness", lambda: _ready(f"{stack.gateway}/readyz"), 300)
    stop = threading.Event()
    admin = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {TOKEN}"})
    urls = [admin.post(f"{stack.gateway}/admin/episodes", json={}).json()["base_url"] for _ in range(AGENTS)]
    agents = [Agent(url, stop) for url in urls]

    def total() -> int:
        return sum(len(a.answered) for a in agents)

    def spool_drained() -> bool:
        state = _admin_state(stack)
        return state is not None and state.get("spool_depth") == 0

    try:
        for agent in agents:
            agent.start()
        _wait_for(stack, "calls before the kill", lambda: total() >= 40, 120)
        kafka = stack.compose("ps", "-q", "kafka").stdout.strip()
        killed = subprocess.run([_docker(), "kill", kafka], capture_output=True, text=True, timeout=60)
        assert killed.returncode == 0, killed.stderr
        at_kill = total()
        _wait_for(stack, "calls answered from the spool", lambda: total() >= at_kill + 20, 120)
        down_calls = total() - at_kill
        started = stack.compose("start", "kafka")
        assert started.returncode == 0, started.stderr
        drained_s = _wait_for(stack, "the spool drained", spool_drained, 180)
        at_restart = total()
        restarted = stack.compose("restart", "--timeout", "20", "gateway")
        assert restarted.returncode == 0, restarted.stderr
        _wait_for(stack, "calls after the gateway restart", lambda: total() >= at_restart + 20, 180)
    finally:
        stop.set()
        for agent in agents:
            agent.join(15)
        admin.close()
    _wait_for(stack, "the spool drained after the restart", spool_drained, 180)
    answered = {cid for a in agents for cid in a.answered}

    reader = HttpEventLogReader(stack.recorder, TOKEN)
    rows: list[list[object]] = []
    sql = (
        "SELECT event_id, JSONExtractString(payload, 'call_id') FROM flywheel.events FINAL "
        "WHERE type = 'llm_call_recorded'"
    )

    def all_recorded() -> bool:
        nonlocal rows
        rows = [list(r) for r in reader.query(sql, max_rows=100_000).rows]
        return answered <= {str(r[1]) for r in rows}

    try:
        with contextlib.suppress(pytest.fail.Exception):
            _wait_for(stack, "every answered call in the event log", all_recorded, 120)
    finally:
        reader.close()
    unique = {str(r[0]): str(r[1]) for r in rows}  # dedup by event_id, as the fault suite does
    per_call = Counter(unique.values())
    lost = answered - set(per_call)
    duplicates = sum(n - 1 for n in per_call.values())
    figures = Figures(
        "compose_broker_kill_gateway_restart",
        calls=len(answered),
        ok=len(answered),
        lost=len(lost),
        duplicates=duplicates,
        server_errors=sum(a.server_errors for a in agents),
        recover_s=round(drained_s, 2),
        extra={"answered_while_down": down_calls},
    )
    figures.report()
    assert not lost and duplicates == 0, figures
    assert down_calls >= 20
