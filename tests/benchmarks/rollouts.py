"""Rollout worker + reward service benchmark (issue 4). Run: ``python tests/benchmarks/rollouts.py [--json]``.

Figures (each with a baseline measured in the same run):
- callable agent (real ``openai`` SDK, 3 calls through the real gateway over loopback HTTP to an instant
  fake upstream), concurrency 16, episodes/s from task published to ``EpisodeScored``: in-process bus
  and real Kafka. Baseline: the same agent calling the fake upstream directly, no Flywheel at all.
- command agent (3 stdlib HTTP calls), concurrency 16: worker overhead per episode (everything the
  worker does except the agent process's own lifetime), p50. Baseline: that lifetime, p50.
- reward service: synthetic episodes of 3 token-faithful calls (~200-token prompts), scored and
  assembled, episodes/s. Baseline: the in-process bus alone passing the same events to a trivial
  consumer that publishes one empty ``EpisodeScored`` per finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
from tests.e2e.rollouts_stack import RolloutStack, free_port
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

CONCURRENCY = 16
# Episodes per CPU-second of this process, per phase: on a machine shared with other work the wall-clock
# rate mostly measures how much CPU the scheduler gave us; this one does not.
CPU_S: dict[str, float] = {}


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


async def _run_tasks(bus: Bus, agent: AgentRef, n: int, task_input: dict[str, Any], within_s: float) -> float:
    counter = Counter(n)
    sub = await bus.subscribe(TRANSITIONS, f"bench-{uuid.uuid4().hex[:6]}", counter.on, from_beginning=False)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        await bus.publish(
            TASKS,
            RolloutRequested(
                task=Task(task_id=f"t{i}", input=task_input),
                agent=agent,
                group_id=f"g{i // 8}",
                group_size=8,
                sample_index=i % 8,
                deadline_s=120,
            ),
        )
    await asyncio.wait_for(counter.done.wait(), within_s)
    elapsed = time.perf_counter() - t0
    CPU_S["last"] = time.process_time() - c0
    await sub.stop()
    return elapsed


async def e2e_callable(kafka: str | None, n: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        stack = RolloutStack(
            Path(tmp),
            kafka=kafka,
            prefix=f"bench-{uuid.uuid4().hex[:8]}.",
            worker_settings={"concurrency": CONCURRENCY},
        )
        await stack.start(workers=1)
        try:
            agent = AgentRef(
                kind=AgentKind.callable, spec="examples.agents_for_tests.callable_agent:run_pooled"
            )
            await _run_tasks(stack.buses[0], agent, CONCURRENCY, {"calls": 3}, 120)  # warm-up
            elapsed = await _run_tasks(stack.buses[0], agent, n, {"calls": 3}, 300)
            CPU_S["kafka" if kafka else "memory"] = n / CPU_S["last"]
        finally:
            await stack.stop()
    return n / elapsed


async def bare_agent(n: int) -> float:
    """The same agent against the fake upstream served on loopback: no gateway, bus, worker or scoring."""
    import uvicorn

    from examples.agents_for_tests.callable_agent import run_pooled as run

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
    elapsed = time.perf_counter() - t0
    CPU_S["bare"] = n / (time.process_time() - c0)
    server.should_exit = True
    await serving
    return n / elapsed


async def command_overhead(n: int, concurrency: int = CONCURRENCY) -> tuple[float, float]:
    _agent_ms.clear()
    with tempfile.TemporaryDirectory() as tmp:
        stack = RolloutStack(Path(tmp), worker_settings={"concurrency": concurrency})
        await stack.start(workers=1)
        try:
            agent = AgentRef(
                kind=AgentKind.command, spec="python examples/agents_for_tests/tiny_http_agent.py"
            )
            await _run_tasks(stack.buses[0], agent, n, {}, 300)
            stats = stack.workers[0].stats
            overhead = statistics.median(stats.overhead_ms)
        finally:
            await stack.stop()
    agent_ms = _agent_ms
    return overhead, statistics.median(agent_ms) if agent_ms else float("nan")


_agent_ms: list[float] = []


def _patch_agent_timing() -> None:
    """Record each command agent's own lifetime (the overhead's complement) for the baseline column."""
    from rollout_worker import command_runner

    original = command_runner.CommandRunner.run

    async def run(self: Any, run_: Any) -> Any:
        result = await original(self, run_)
        _agent_ms.append(result.agent_s * 1000)
        return result

    command_runner.CommandRunner.run = run  # type: ignore[method-assign,assignment]


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
    from reward_service.app import build_service
    from reward_service.settings import RewardSettings

    events = synthetic_episodes(n)

    async def measure(consumer: str) -> float:
        async with MemoryBus(max_backlog=1_000_000) as bus:
            counter = Counter(n)
            await bus.subscribe(TRANSITIONS, "bench", counter.on)
            service = None
            if consumer == "reward":
                service = build_service(bus, RewardSettings(bus="memory", sweep_interval_s=60))
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


async def main(as_json: bool) -> None:
    configure_logging("ERROR", json=True)
    _patch_agent_timing()
    kafka = _kafka()
    bare = await bare_agent(160)
    mem = await e2e_callable(None, 160)
    kaf = await e2e_callable(kafka, 160) if kafka else float("nan")
    overhead, agent_ms = await command_overhead(32)
    overhead_c1, _ = await command_overhead(6, concurrency=1)
    reward, reward_bare = await reward_throughput(2000)
    figures = {
        "callable_memory_episodes_per_s": round(mem, 1),
        "callable_kafka_episodes_per_s": round(kaf, 1),
        "command_worker_overhead_p50_ms": round(overhead, 2),
        "reward_scored_episodes_per_s": round(reward, 1),
        "baseline_bare_agent_episodes_per_s": round(bare, 1),
        "baseline_command_agent_lifetime_p50_ms": round(agent_ms, 1),
        "baseline_bus_only_episodes_per_s": round(reward_bare, 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "command_worker_overhead_p50_ms_at_concurrency_1": round(overhead_c1, 2),
        "callable_memory_episodes_per_cpu_s": round(CPU_S.get("memory", float("nan")), 1),
        "callable_kafka_episodes_per_cpu_s": round(CPU_S.get("kafka", float("nan")), 1),
        "baseline_bare_agent_episodes_per_cpu_s": round(CPU_S.get("bare", float("nan")), 1),
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
        ("callable agent, in-process bus, episodes/s", mem, bare, "bare agent, no Flywheel", "≥ 100"),
        ("callable agent, real Kafka, episodes/s", kaf, bare, "bare agent, no Flywheel", "≥ 50"),
        (
            "worker overhead per command episode, p50 ms",
            overhead,
            agent_ms,
            "agent process lifetime p50 ms",
            "≤ 20",
        ),
        (
            "reward service, scored episodes/s (3 calls)",
            reward,
            reward_bare,
            "bus + trivial consumer",
            "≥ 500",
        ),
    ]
    print(f"{'figure':46} {'value':>9} {'baseline':>9} {'ratio':>7}  {'goal':>6}  baseline is")
    for name, value, base, what, goal in rows:
        ratio = value / base if base and base == base else float("nan")
        print(f"{name:46} {value:9.1f} {base:9.1f} {ratio:7.2f}  {goal:>6}  {what}")
    if not kafka:
        print("(Kafka unreachable: the Kafka row is nan)")
    print(
        f"worker overhead per command episode at concurrency 1 (no agents competing), p50 ms: {overhead_c1:.1f}"
    )
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        "episodes per CPU-second of this process (scheduler-independent): "
        f"in-process {CPU_S.get('memory', float('nan')):.1f}, Kafka {CPU_S.get('kafka', float('nan')):.1f}, "
        f"bare agent {CPU_S.get('bare', float('nan')):.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    asyncio.run(main(parser.parse_args().json))
