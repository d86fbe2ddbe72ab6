"""What OpenTelemetry export costs: CPU per recorded call in the process that exports, and its rate.

    python tests/benchmarks/otel_export.py [--json] [--episodes 1000] [--calls 2] [--endpoint URL]

The exporter (``infra/otel/exporter.py``) is a bus consumer: the gateway's request path never runs it,
so ``tests/benchmarks/gateway.py``'s figures for ``flywheel gateway`` do not change with export on (the
gateway process is the same). What export does cost is CPU in the process that runs it: a process of its
own beside a Kafka deployment, or the embedded stack's one process (``flywheel up``), where it shares the
interpreter with the gateway. This measures that cost on the in-process bus: ``--episodes`` episodes of
``--calls`` calls each (~2 KB request/response bodies, like the gateway benchmark's), with their start,
a per-call reward, finish and score, are published; the same events are published once more to a bus
without the exporter; the difference in this process's CPU time (every thread: the consumer, and the
SDK's batch thread that encodes protobuf and posts it) per call is the figure. The spans go to a live
OTLP/HTTP receiver at ``--endpoint`` (``phoenix serve`` from ``infra/scripts/phoenix_env.sh``), which
runs in its own process and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from infra.bus.memory import MemoryBus
from infra.otel.exporter import make_exporter
from schemas import (
    EPISODES,
    TRANSITIONS,
    CallChoice,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    RewardReported,
)
from schemas.ids import new_episode_id

GOALS = {"export_cpu_ms_per_call": "≤ 0.5"}  # the gateway's own recording budget (gateway.py's goals)


def _events(episodes: int, calls: int) -> list[tuple[str, Any]]:
    text = "x" * 1000
    out: list[tuple[str, Any]] = []
    for _ in range(episodes):
        ep = new_episode_id()
        out.append((EPISODES, EpisodeStarted(episode_id=ep, group_id="g")))
        for seq in range(calls):
            request = json.dumps({"model": "policy", "messages": [{"role": "user", "content": text}]})
            out.append(
                (
                    EPISODES,
                    LLMCallRecorded(
                        episode_id=ep,
                        call_seq=seq,
                        call_id=f"c{seq}",
                        model="policy",
                        request=request,
                        response=json.dumps({"id": f"r{seq}", "model": "policy", "content": text}),
                        choices=[
                            CallChoice(
                                index=0,
                                message={"role": "assistant", "content": text[:200]},
                                finish_reason="stop",
                                token_ids=list(range(64)),
                                logprobs=[-0.5] * 64,
                            )
                        ],
                        prompt_tokens=300,
                        completion_tokens=64,
                        latency_ms=10.0,
                        token_faithful=True,
                    ),
                )
            )
            out.append((EPISODES, RewardReported(episode_id=ep, value=1.0, call_seq=seq)))
        out.append((EPISODES, EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok)))
        out.append(
            (TRANSITIONS, EpisodeScored(episode_id=ep, group_id="g", reward=1.0, reward_source="exact"))
        )
    return out


async def _run(events: list[tuple[str, Any]], endpoint: str | None, spans_expected: int) -> dict[str, float]:
    async with MemoryBus() as bus:
        exporter = None
        if endpoint:
            exporter = make_exporter(bus, endpoint, score_wait_s=3600)
            await exporter.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for topic, event in events:
            await bus.publish(topic, event)
        if exporter is not None:
            while exporter.stats.spans < spans_expected:  # noqa: ASYNC110 (the consumer only counts)
                await asyncio.sleep(0.01)
            await exporter.stop()  # flushes the SDK's queue: every span sent
        return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}


async def main(a: argparse.Namespace) -> dict[str, Any]:
    events = _events(a.episodes, a.calls)
    calls = a.episodes * a.calls
    spans = a.episodes * (a.calls + 1)
    base = await _run(events, None, 0)
    on = await _run(_events(a.episodes, a.calls), a.endpoint, spans)
    cpu_ms = (on["cpu_s"] - base["cpu_s"]) * 1000 / calls
    return {
        "figures": {
            "export_cpu_ms_per_call": round(cpu_ms, 4),
            "export_spans_per_s": round(spans / on["wall_s"], 1),
            "calls": calls,
            "spans": spans,
        },
        "goals": GOALS,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=2, help="calls per episode")
    parser.add_argument("--endpoint", default="http://127.0.0.1:6006", help="a live OTLP/HTTP receiver")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result["figures"].items():
            goal = GOALS.get(key, "")
            print(f"{key:28s} {value:>12}  {goal}")
