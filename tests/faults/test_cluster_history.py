"""The stack on a three-broker cluster, four kills, then the history checker over the whole event log.

A cluster of this test's own (``infra.kafka.launcher.cluster``: RF=3, min ISR 2), a fake upstream, two
gateways (by signed ticket), two workers (one per gateway: an episode's calls on one gateway) running
the ``openai``-SDK chat agent (the SDK's own retries on, every HTTP attempt's status logged), two reward
services in one group and a trainer on a tiny model. Agents call while the test SIGKILLs, one after
another, the leader broker of the busiest partition of ``flywheel.episodes``, a gateway, a worker and a
reward service, restarting each. Then it reads ``flywheel.episodes`` and ``flywheel.transitions`` whole,
the trainer's committed offsets and the agents' attempt logs, and ``tests/faults/history.py`` checks
them: every call recorded once after dedup by event id, call numbers unique per episode, every finished
episode scored once per revision and from all its calls, every scored episode's transitions below the
trainer's committed offset, no 5xx outside the retry path. Figures: calls, episodes, kills, retried
calls, consumer-group rebalances, seconds from each kill to the next score.

Every run has the short version (3 tasks a wave, about 3 minutes);
``FLYWHEEL_CLUSTER_HISTORY=1 python -m pytest -s tests/faults/test_cluster_history.py`` runs the long
one (8 tasks a wave, about 8 minutes on two shared cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from infra.bus.base import Message
from infra.bus.kafka import KafkaBus
from infra.kafka import launcher
from schemas import EPISODES, TRANSITIONS, EpisodeFinished, EpisodeScored, spec_for
from tests.fakes.upstream import create_fake_upstream
from tests.fakes.waiting import wait_until
from tests.faults.history import Attempt, ClientCall, Logged, check
from tests.faults.procs import FLYWHEEL, ChildProcess, Figures, GatewayProcess, ThreadServer, clean_env
from tests.faults.test_kafka_cluster import _free_run, _partitions
from trainer.models.tiny import build_tiny

CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(12) for b in range(12)]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PREFIX = "faults-history."
REPO = Path(__file__).resolve().parents[2]
AGENT = f"{sys.executable} examples/agents_for_tests/chat_agent.py"
TASKS_PER_WAVE = 8 if os.environ.get("FLYWHEEL_CLUSTER_HISTORY") == "1" else 3
SAMPLES = 2
WAVES = 5
TINY_MODEL = Path.home() / ".cache" / "flywheel" / "models" / "faults-history-tiny"


class Service(ChildProcess):
    """``flywheel <args>`` as a child process that can be SIGKILLed and started again."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], tmp: Path) -> None:
        self.name, self.args, self.tmp = name, args, tmp
        self.env = {**env, "FLYWHEEL_DATA_DIR": str(tmp / name)}

    def start(self) -> None:
        with (self.tmp / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [FLYWHEEL, *self.args], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def tail(self, chars: int = 3000) -> str:
        return (self.tmp / f"{self.name}.log").read_text(errors="replace")[-chars:]


def _submit(env: dict[str, str], tmp: Path, wave: int, tasks: int = TASKS_PER_WAVE) -> None:
    path = tmp / f"tasks-{wave}.jsonl"
    lines = [
        {"task_id": f"w{wave}-{i}", "input": {"question": f"{i} plus {wave}?", "calls": 4, "pause": 1.0}}
        for i in range(tasks)
    ]
    path.write_text("".join(json.dumps(t) + "\n" for t in lines))
    argv = [
        FLYWHEEL,
        "tasks",
        "submit",
        str(path),
        "--agent",
        AGENT,
        "--n",
        str(SAMPLES),
        "--deadline",
        "120",
    ]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _attempts(path: Path) -> list[ClientCall]:
    """The agents' attempt logs as one ``ClientCall`` per (episode, call), attempts in order."""
    calls: dict[tuple[str, int], list[Attempt]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            attempt = Attempt(int(row["status"]), bool(row["retry_after"]))
            calls.setdefault((row["episode_id"], int(row["call"])), []).append(attempt)
    return [ClientCall(episode, tuple(attempts)) for (episode, _), attempts in calls.items()]


async def _committed(bus: KafkaBus, topic: str, group: str) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (partitions it never committed: absent)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(bus.physical(topic), p) for p in range(spec_for(topic).partitions)]
        offsets = await admin.list_consumer_group_offsets(bus.physical(group), partitions=tps)
    finally:
        await admin.close()
    return {
        tp.partition: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0
    }


def _assignments(tmp: Path) -> int:
    """How many times the services' consumers were assigned partitions (each rebalance logs one a member)."""
    return sum(
        log.read_text(errors="replace").count('"bus.partitions_assigned"') for log in tmp.glob("*.log")
    )


async def _run(tmp: Path) -> tuple[Figures, list[Logged], list[ClientCall], dict[int, int]]:
    model = await asyncio.to_thread(build_tiny, TINY_MODEL, CORPUS, vocab_size=320, hidden=64, layers=2)
    nodes = launcher.cluster(3, _free_run(6), tmp / "kafka")
    await asyncio.to_thread(launcher.start_cluster, nodes)
    bootstrap = ",".join(n.bootstrap for n in nodes)
    env = clean_env(
        FLYWHEEL_BUS="kafka",
        FLYWHEEL_KAFKA_BOOTSTRAP=bootstrap,
        FLYWHEEL_TOPIC_PREFIX=PREFIX,
        FLYWHEEL_EPISODE_KEY="cluster-history-episode-key-0123",
        FLYWHEEL_PUBLISH_TIMEOUT_S="5",
        FLYWHEEL_LOG_JSON="true",
        PYTHONPATH=str(REPO),
        CHAT_AGENT_CALL_LOG=str(tmp / "attempts.jsonl"),
        CHAT_AGENT_MAX_RETRIES="8",
    )
    trainer_env = {
        **env,
        "FLYWHEEL_TRAINER_BASE_MODEL": str(model),
        "FLYWHEEL_TRAINER_BATCH_GROUPS": "2",
        "FLYWHEEL_TRAINER_GROUP_TIMEOUT_S": "60",
        "FLYWHEEL_TRAINER_EXPECTED_GATEWAYS": "0",
    }
    argv = [FLYWHEEL, "topics", "create"]
    await asyncio.to_thread(subprocess.run, argv, env=env, check=True, timeout=120, capture_output=True)
    scored_at: list[float] = []
    finished: set[tuple[str, str | None, int]] = set()  # (episode, task, sample) of episodes not superseded
    scored: set[str] = set()

    async def on_scored(message: Message) -> None:
        if isinstance(message.event, EpisodeScored):
            scored_at.append(time.monotonic())
            scored.add(message.event.episode_id)

    async def on_finished(message: Message) -> None:
        event = message.event
        if isinstance(event, EpisodeFinished) and not event.superseded:
            finished.add((event.episode_id, event.task_id, event.sample_index))

    def all_scored() -> bool:
        samples = {(task, sample) for _, task, sample in finished}
        return len(samples) >= WAVES * TASKS_PER_WAVE * SAMPLES and {ep for ep, _, _ in finished} <= scored

    bus = KafkaBus(bootstrap, prefix=PREFIX)
    await bus.start()
    sub = await bus.subscribe(TRANSITIONS, "history-observer", on_scored, from_beginning=True)
    sub_finished = await bus.subscribe(EPISODES, "history-observer", on_finished, from_beginning=True)
    figures = Figures("cluster_history")
    services: list[Service] = []
    gateways: list[GatewayProcess] = []
    recover: dict[str, float] = {}
    try:
        with ThreadServer(create_fake_upstream()) as upstream:
            for i in (1, 2):
                gw = GatewayProcess(upstream.url, tmp / f"gw{i}", env, tmp / f"gw{i}.log")
                gw.start()
                gateways.append(gw)
            for gw in gateways:
                await asyncio.to_thread(gw.wait_ready, 120)
            for i in (1, 2):
                services.append(Service(f"reward{i}", ["reward"], env, tmp))
                services.append(
                    Service(
                        f"worker{i}",
                        ["worker", "--gateway", gateways[i - 1].url, "--concurrency", "4"],
                        env,
                        tmp,
                    )
                )
            services.append(Service("trainer", ["trainer", "run"], trainer_env, tmp))
            for svc in services:
                svc.start()

            async def kill_and_restart(name: str, kill: object, restart: object, wave: int) -> None:
                await asyncio.to_thread(_submit, env, tmp, wave)
                base = len(scored_at)
                # the wave's first score: its other episodes still have calls to make through the kill
                await wait_until(lambda: len(scored_at) >= base + 1, 180, f"a score before killing {name}")
                killed = time.monotonic()
                await asyncio.to_thread(kill)  # type: ignore[arg-type]
                await asyncio.sleep(1.0)
                await asyncio.to_thread(restart)  # type: ignore[arg-type]
                await wait_until(lambda: scored_at[-1] > killed, 180, f"a score after killing {name}")
                recover[name] = round(next(t for t in scored_at if t > killed) - killed, 2)

            parts = await _partitions(bootstrap, PREFIX + EPISODES)
            await asyncio.to_thread(_submit, env, tmp, 0)
            await wait_until(lambda: len(scored_at) >= 4, 240, "the first scores")
            read = await bus.read_partitions(EPISODES, list(range(spec_for(EPISODES).partitions)))
            busiest_p = max(read, key=lambda p: len(read[p]))
            busiest = next(p for p in parts if p["partition"] == busiest_p)
            victim = nodes[busiest["leader"] - 1]

            def restart_gateway() -> None:
                gateways[0].start()
                gateways[0].wait_ready(120)

            def kill_broker() -> None:
                pid = launcher.read_pid(victim)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)

            await kill_and_restart("broker", kill_broker, lambda: launcher.start(victim), 1)
            await kill_and_restart("gateway", gateways[0].kill9, restart_gateway, 2)
            await kill_and_restart("worker", services[1].kill9, services[1].start, 3)
            await kill_and_restart("reward", services[0].kill9, services[0].start, 4)
            await wait_until(all_scored, 240, "every episode of the five waves finished and scored")
            lag: list[int] = []

            async def trainer_caught_up() -> bool:
                lag.append(await bus.lag(TRANSITIONS, "trainer"))
                return lag[-1] == 0

            for _ in range(240):
                if await trainer_caught_up():
                    break
                await asyncio.sleep(0.5)
            assert lag[-1] == 0, f"the trainer is {lag[-1]} scored episodes behind: {services[-1].tail()}"
            committed = await _committed(bus, TRANSITIONS, "trainer")
    finally:
        await sub.stop()
        await sub_finished.stop()
        for svc in sorted(services, key=lambda s: not s.name.startswith("worker")):  # workers first
            svc.stop()
        for gw in gateways:
            gw.stop()
    try:
        logged: list[Logged] = []
        for topic in (EPISODES, TRANSITIONS):
            read = await bus.read_partitions(topic, list(range(spec_for(topic).partitions)))
            logged += [Logged(m.event, m.topic, m.partition, m.offset) for ms in read.values() for m in ms]
    finally:
        await bus.stop()
        for node in nodes:
            await asyncio.to_thread(launcher.stop, node)
    figures.extra = {
        "kills": 4,
        "partition_assignments": _assignments(tmp),
        **{f"{k}_kill_to_next_score_s": v for k, v in recover.items()},
    }
    return figures, logged, _attempts(tmp / "attempts.jsonl"), committed


def test_stack_on_a_cluster_survives_four_kills_and_its_history_checks(tmp_path: Path) -> None:
    figures, logged, client, committed = asyncio.run(_run(tmp_path))
    violations, history = check(logged, client, committed)
    figures.calls = figures.ok = history.calls_recorded
    figures.lost = sum(1 for v in violations if v.rule not in ("call-seq-unique", "no-5xx"))
    figures.duplicates = sum(1 for v in violations if v.rule == "call-seq-unique")
    figures.server_errors = history.violations.get("no-5xx", 0)
    figures.extra.update(
        {
            "episodes_finished": history.episodes_finished,
            "episodes_scored": history.episodes_scored,
            "client_calls": history.client_calls,
            "retried_calls": history.retried_calls,
            "duplicate_records": history.duplicate_records,
        }
    )
    figures.report()
    assert violations == [], (violations[:10], figures)
    assert history.episodes_finished >= WAVES * TASKS_PER_WAVE * SAMPLES
    assert history.client_calls >= history.calls_recorded  # every recorded call came from a logged attempt
