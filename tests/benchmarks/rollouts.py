"""Rollout worker + reward service benchmark (issue 4). Run: ``python tests/benchmarks/rollouts.py [--json]``.

Figures (each with a baseline measured in the same run):
- callable agents, concurrency 16, 3 calls each through the real gateway over loopback HTTP to an instant
  fake upstream, episodes/s from task published to ``EpisodeScored``. Two trivial agents:
  ``lean_agent:run`` (each call one hand-written HTTP/1.1 request on a pooled connection: measures
  Flywheel) and ``callable_agent:run_pooled`` (the real ``openai`` SDK, ~5 ms of CPU per call here:
  measures mostly the SDK). Baseline for each: the same agent calling the fake upstream directly,
  no Flywheel at all.
  - in-process bus: the embedded runtime (``flywheel up``): gateway, worker, agents and reward service
    share one process, as they do in that deployment.
  - real Kafka: the distributed runtime: this process is ``flywheel worker`` (the worker and the
    callable agents it runs), a second process is the gateway (with the fake upstream in it) and the
    reward service, each on its own Kafka connection.
- command agent (3 stdlib HTTP calls), concurrency 16: worker overhead per episode (everything the
  worker does except the agent process's lifetime, spawn included in the lifetime), p50, in the
  embedded runtime. Baseline: that lifetime, p50. Also shown: the same at concurrency 1, the worker's
  own CPU per episode (worker alone in its process, Kafka) and the agents' CPU per episode.
- reward service: synthetic episodes of 3 token-faithful calls (~200-token prompts), scored and
  assembled, episodes/s. Baseline: the in-process bus alone passing the same events to a trivial
  consumer that publishes one empty ``EpisodeScored`` per finish.

``--serve-services KAFKA PREFIX`` is the second process of the Kafka rows (internal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flywheel.stack import BusFactory, EmbeddedStack, StackSettings
from infra.bus.base import Bus, Message
from infra.logging import configure_logging
from schemas import (
    EPISODES,
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    CallChoice,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    RolloutRequested,
    ScorerSpec,
    Task,
    new_episode_id,
)
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream, fake_upstream

CONCURRENCY = 16
LEAN = "examples.agents_for_tests.lean_agent:run"
SDK = "examples.agents_for_tests.callable_agent:run_pooled"
COMMAND = "python examples/agents_for_tests/tiny_http_agent.py"
_CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class Rate:
    per_s: float  # episodes per wall-clock second
    cpu_ms: float  # CPU ms per episode of this process (all its threads)
    other_cpu_ms: float = float("nan")  # CPU ms per episode of the services process (Kafka rows)


class Counter:
    def __init__(self, target: int) -> None:
        self.n = 0
        self.target = target
        self.done = asyncio.Event()

    async def on(self, msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            self.n += 1
            if self.n >= self.target:
                self.done.set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rollout_stack(tmp: str, bus_factory: BusFactory | None = None, **settings: Any) -> EmbeddedStack:
    """Gateway (in front of the instant fake upstream), worker and reward service: the embedded stack
    without engine, trainer or recorder. Episode URLs carry plain ids (no episode key), so the
    Kafka rows' worker, in another process, needs no shared key."""
    stack_settings = StackSettings(
        data_dir=Path(tmp),
        run_trainer=False,
        record_events=False,
        make_episode_key=False,
        episode_wait_s=5.0,
        shutdown_drain_timeout_s=1.0,
        **settings,
    )
    upstream = fake_upstream(FakeUpstreamConfig(use_tools=False, keep_requests=False))
    return EmbeddedStack(stack_settings, upstream=upstream, bus_factory=bus_factory)


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process, all threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


async def _run_tasks(
    bus: Bus, agent: AgentRef, n: int, within_s: float, other_pid: int | None = None
) -> Rate:
    counter = Counter(n)
    sub = await bus.subscribe(TRANSITIONS, f"bench-{uuid.uuid4().hex[:6]}", counter.on, from_beginning=False)
    o0 = _proc_cpu_s(other_pid) if other_pid else 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        await bus.publish(
            TASKS,
            RolloutRequested(
                task=Task(task_id=f"t{i}", input={"calls": 3}),
                agent=agent,
                group_id=f"g{i // 8}",
                group_size=8,
                sample_index=i % 8,
                deadline_s=120,
            ),
        )
    await asyncio.wait_for(counter.done.wait(), within_s)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    other = (_proc_cpu_s(other_pid) - o0) / n * 1000 if other_pid else float("nan")
    await sub.stop()
    return Rate(n / elapsed, cpu / n * 1000, other)


async def e2e_memory(spec: str, n: int) -> Rate:
    """The embedded runtime: gateway, worker (with its callable agents) and reward service, one process."""
    with tempfile.TemporaryDirectory() as tmp:
        async with rollout_stack(tmp, concurrency=CONCURRENCY) as stack:
            agent = AgentRef(kind=AgentKind.callable, spec=spec)
            await _run_tasks(stack.buses[0], agent, CONCURRENCY, 120)  # warm-up
            return await _run_tasks(stack.buses[0], agent, n, 300)


class Services:
    """The second process of the Kafka rows: gateway (+ fake upstream) and reward service."""

    def __init__(self, kafka: str, prefix: str) -> None:
        self.kafka, self.prefix = kafka, prefix
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def __aenter__(self) -> Services:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--serve-services",
            self.kafka,
            self.prefix,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if not line.startswith(b"http://"):
            raise RuntimeError(f"services process did not start: {line!r}")
        self.url = line.decode().strip()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def serve_services(kafka: str, prefix: str) -> None:
    from infra.bus.kafka import KafkaBus

    configure_logging("ERROR", json=True)
    with tempfile.TemporaryDirectory() as tmp:
        connect = partial(KafkaBus, kafka, prefix=prefix, session_timeout_ms=6000)
        settings = {"bus": "kafka", "kafka_bootstrap": kafka, "topic_prefix": prefix, "run_worker": False}
        async with rollout_stack(tmp, connect, **settings) as stack:
            print(stack.gateway_url, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # EOF: stop


async def e2e_kafka(kafka: str, spec: str, n: int, kind: AgentKind = AgentKind.callable) -> tuple[Rate, Any]:
    """The distributed runtime: this process is the worker; gateway + reward service run in another."""
    from infra.bus.kafka import KafkaBus
    from rollout_worker.service import RolloutWorker
    from rollout_worker.settings import WorkerSettings

    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    admin = KafkaBus(kafka, prefix=prefix, session_timeout_ms=6000)
    await admin.start()
    await admin.ensure_topics([TASKS, EPISODES, TRANSITIONS])
    async with Services(kafka, prefix) as services:
        assert services.proc is not None
        bus = KafkaBus(kafka, prefix=prefix, session_timeout_ms=6000)
        await bus.start()
        settings = WorkerSettings(gateway_url=services.url, worker_id="w0", concurrency=CONCURRENCY)
        worker = RolloutWorker(bus, settings)
        await worker.start()
        try:
            agent = AgentRef(kind=kind, spec=spec)
            await _run_tasks(admin, agent, CONCURRENCY, 120)  # warm-up (and every group has joined)
            worker.stats.overhead_ms.clear()
            worker.stats.agent_ms.clear()
            rate = await _run_tasks(admin, agent, n, 300, services.proc.pid)
            stats = worker.stats
        finally:
            await worker.stop(drain_timeout_s=1.0)
            await bus.stop()
            await admin.stop()
    return rate, stats


async def bare_agent(spec: str, n: int) -> Rate:
    """The same agent against the fake upstream served on loopback: no gateway, bus, worker or scoring."""
    import uvicorn

    from rollout_worker.callable_runner import load_callable

    run = load_callable(spec)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_fake_upstream(FakeUpstreamConfig(use_tools=False, keep_requests=False)),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no started event)
        await asyncio.sleep(0.02)
    llm = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", model="m")
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await run({"task_id": str(i), "input": {"calls": 3}}, llm)

    await asyncio.gather(*(one(i) for i in range(CONCURRENCY)))
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    server.should_exit = True
    await serving
    return Rate(n / elapsed, cpu / n * 1000)


@dataclass
class CommandFigures:
    overhead_p50_ms: float
    agent_p50_ms: float
    agent_cpu_ms: float  # CPU of the agent processes per episode


async def command_overhead(n: int, concurrency: int = CONCURRENCY, nice: int | None = None) -> CommandFigures:
    """The embedded runtime (one process, in-process bus) running command agents (``nice``: the
    worker's ``agent_nice``; None keeps its default)."""
    settings: dict[str, Any] = {"concurrency": concurrency}
    if nice is not None:
        settings["agent_nice"] = nice
    with tempfile.TemporaryDirectory() as tmp:
        async with rollout_stack(tmp, **settings) as stack:
            agent = AgentRef(kind=AgentKind.command, spec=COMMAND)
            children0 = _children_cpu_s()
            await _run_tasks(stack.buses[0], agent, n, 300)
            agent_cpu = (_children_cpu_s() - children0) / n * 1000
            stats = stack.workers[0].stats
    return CommandFigures(statistics.median(stats.overhead_ms), statistics.median(stats.agent_ms), agent_cpu)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def synthetic_episodes(n: int) -> list[Any]:
    events: list[Any] = []
    for i in range(n):
        ep = new_episode_id()
        task = Task(task_id=f"t{i}", answer="42", scorer=ScorerSpec(name="exact"))
        events.append(
            EpisodeStarted(episode_id=ep, task=task, group_id=f"g{i // 8}", group_size=8, sample_index=i % 8)
        )
        prompt = list(range(200))
        for seq in range(3):
            response = [1000 + seq * 10 + k for k in range(30)]
            events.append(
                LLMCallRecorded(
                    episode_id=ep,
                    call_seq=seq,
                    call_id=f"{ep}-{seq}",
                    request="{}",
                    token_faithful=True,
                    prompt_token_ids=prompt,
                    choices=[
                        CallChoice(
                            index=0,
                            text="42",
                            message={"role": "assistant", "content": "42"},
                            token_ids=response,
                            logprobs=[-0.1] * 30,
                        )
                    ],
                )
            )
            prompt = prompt + response + [7, 8, 9]
        events.append(
            EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, output="42", group_id=f"g{i // 8}")
        )
    return events


async def reward_throughput(n: int) -> tuple[float, float]:
    from infra.bus.memory import MemoryBus
    from reward_service.app import build
    from reward_service.settings import RewardSettings

    events = synthetic_episodes(n)

    async def measure(consumer: str) -> float:
        async with MemoryBus(max_backlog=1_000_000) as bus:
            counter = Counter(n)
            await bus.subscribe(TRANSITIONS, "bench", counter.on)
            service = None
            if consumer == "reward":
                service = build(RewardSettings(bus="memory", sweep_interval_s=60), bus)
                await service.start()
            else:

                async def trivial(batch: Any) -> None:
                    for m in batch:
                        if isinstance(m.event, EpisodeFinished):
                            await bus.publish(
                                TRANSITIONS, EpisodeScored(episode_id=m.event.episode_id, group_id="g")
                            )

                await bus.subscribe_batch(EPISODES, "bare", trivial, max_batch=500)
            t0 = time.perf_counter()
            for event in events:
                await bus.publish(EPISODES, event)
            await asyncio.wait_for(counter.done.wait(), 300)
            elapsed = time.perf_counter() - t0
            if service is not None:
                await service.stop()
        return n / elapsed

    bare = await measure("bare")
    return await measure("reward"), bare


def _kafka() -> str | None:
    bootstrap = os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return bootstrap
    except OSError:
        return None


NAN = Rate(float("nan"), float("nan"))


async def main(as_json: bool) -> None:
    configure_logging("ERROR", json=True)
    kafka = _kafka()
    bare_lean, bare_sdk = await bare_agent(LEAN, 320), await bare_agent(SDK, 160)
    mem_lean, mem_sdk = await e2e_memory(LEAN, 320), await e2e_memory(SDK, 160)
    kaf_lean, kaf_sdk, kaf_cmd_overhead, kaf_cmd_cpu = NAN, NAN, float("nan"), float("nan")
    if kafka:
        kaf_lean = (await e2e_kafka(kafka, LEAN, 320))[0]
        kaf_sdk = (await e2e_kafka(kafka, SDK, 160))[0]
        kaf_cmd, kaf_cmd_stats = await e2e_kafka(kafka, COMMAND, 32, AgentKind.command)
        kaf_cmd_overhead, kaf_cmd_cpu = statistics.median(kaf_cmd_stats.overhead_ms), kaf_cmd.cpu_ms
    cmd = await command_overhead(32)
    cmd_c1 = await command_overhead(6, concurrency=1)
    reward, reward_bare = await reward_throughput(2000)
    figures = {
        "callable_memory_episodes_per_s": round(mem_lean.per_s, 1),
        "callable_kafka_episodes_per_s": round(kaf_lean.per_s, 1),
        "command_worker_overhead_p50_ms": round(cmd.overhead_p50_ms, 2),
        "reward_scored_episodes_per_s": round(reward, 1),
        "baseline_bare_agent_episodes_per_s": round(bare_lean.per_s, 1),
        "baseline_command_agent_lifetime_p50_ms": round(cmd.agent_p50_ms, 1),
        "baseline_bus_only_episodes_per_s": round(reward_bare, 1),
        "callable_sdk_memory_episodes_per_s": round(mem_sdk.per_s, 1),
        "callable_sdk_kafka_episodes_per_s": round(kaf_sdk.per_s, 1),
        "baseline_bare_sdk_agent_episodes_per_s": round(bare_sdk.per_s, 1),
        "cpu_ms_per_episode_memory": round(mem_lean.cpu_ms, 2),
        "cpu_ms_per_episode_kafka_worker_process": round(kaf_lean.cpu_ms, 2),
        "cpu_ms_per_episode_kafka_services_process": round(kaf_lean.other_cpu_ms, 2),
        "cpu_ms_per_episode_bare_agent": round(bare_lean.cpu_ms, 2),
        "cpu_ms_per_episode_sdk_memory": round(mem_sdk.cpu_ms, 2),
        "cpu_ms_per_episode_bare_sdk_agent": round(bare_sdk.cpu_ms, 2),
        "command_worker_overhead_p50_ms_at_concurrency_1": round(cmd_c1.overhead_p50_ms, 2),
        "command_worker_overhead_p50_ms_kafka_worker_alone": round(kaf_cmd_overhead, 2),
        "command_worker_cpu_ms_per_episode_kafka_worker_alone": round(kaf_cmd_cpu, 2),
        "command_agent_cpu_ms_per_episode": round(cmd.agent_cpu_ms, 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    goals = {
        "callable_memory_episodes_per_s": "≥ 100",
        "callable_kafka_episodes_per_s": "≥ 50",
        "command_worker_overhead_p50_ms": "≤ 20",
        "reward_scored_episodes_per_s": "≥ 500",
    }
    if as_json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    rows = [
        (
            "callable agent, in-process bus, episodes/s",
            mem_lean.per_s,
            bare_lean.per_s,
            "≥ 100",
            "bare agent",
        ),
        ("callable agent, real Kafka, episodes/s", kaf_lean.per_s, bare_lean.per_s, "≥ 50", "bare agent"),
        (
            "worker overhead per command episode, p50 ms",
            cmd.overhead_p50_ms,
            cmd.agent_p50_ms,
            "≤ 20",
            "agent process lifetime p50 ms",
        ),
        (
            "reward service, scored episodes/s (3 calls)",
            reward,
            reward_bare,
            "≥ 500",
            "bus + trivial consumer",
        ),
        (
            "  SDK agent, in-process bus, episodes/s",
            mem_sdk.per_s,
            bare_sdk.per_s,
            "(≥ 100)",
            "bare SDK agent",
        ),
        ("  SDK agent, real Kafka, episodes/s", kaf_sdk.per_s, bare_sdk.per_s, "(≥ 50)", "bare SDK agent"),
    ]
    print(f"{'figure':46} {'value':>9} {'baseline':>9} {'ratio':>7}  {'goal':>7}  baseline is")
    for name, value, base, goal, what in rows:
        ratio = value / base if base and base == base else float("nan")
        print(f"{name:46} {value:9.1f} {base:9.1f} {ratio:7.2f}  {goal:>7}  {what}")
    print(
        "callable agents: lean_agent:run (hand-written HTTP/1.1) for the goal rows; SDK rows: "
        "callable_agent:run_pooled (openai SDK). Kafka rows: worker process + gateway/reward process."
    )
    if not kafka:
        print("(Kafka unreachable: the Kafka rows are nan)")
    print(
        f"CPU ms per episode: in-process {mem_lean.cpu_ms:.2f} (bare agent {bare_lean.cpu_ms:.2f}); "
        f"Kafka worker process {kaf_lean.cpu_ms:.2f} + gateway/reward process {kaf_lean.other_cpu_ms:.2f}; "
        f"SDK in-process {mem_sdk.cpu_ms:.2f} (bare SDK agent {bare_sdk.cpu_ms:.2f})"
    )
    print(
        f"command agents: worker overhead p50 at concurrency 1 {cmd_c1.overhead_p50_ms:.1f} ms; "
        f"worker alone in its process (Kafka) p50 {kaf_cmd_overhead:.1f} ms, its CPU {kaf_cmd_cpu:.2f} ms/episode; "
        f"agent processes' CPU {cmd.agent_cpu_ms:.1f} ms/episode"
    )
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve-services", nargs=2, metavar=("KAFKA", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_services:
        asyncio.run(serve_services(*args.serve_services))
    else:
        asyncio.run(main(args.json))
