"""The SQL agent's callable form (``examples.demo_agents.sql_agent.agent:run``): the same LangGraph graph as the
command, its three roles' models built from ``llm.base_url`` / ``llm.api_key``, many episodes at once
on one event loop, against the fake vLLM-compatible server over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.demo_agents.sql_agent.data import Benchmark, generate
from gateway.server import GatewayServer
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")


@dataclass(frozen=True)
class LLM:
    base_url: str
    api_key: str
    model: str = "policy"


@pytest.fixture
def bench(tmp_path: Path) -> Benchmark:
    return generate(tmp_path / "dbs", seed=2, databases=2, questions_per_db=3)


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeUpstreamConfig, str]]:
    cfg = FakeUpstreamConfig(use_tools=False)
    server = GatewayServer(create_fake_upstream(cfg), port=0)
    url = await server.start() + "/v1"
    try:
        yield cfg, url
    finally:
        await server.stop()


@pytest.mark.timeout(60)
async def test_a_query_that_runs_is_checked_once(
    bench: Benchmark, upstream: tuple[FakeUpstreamConfig, str]
) -> None:
    from examples.demo_agents.sql_agent.agent import run

    cfg, url = upstream
    example = bench.examples[0]
    cfg.reply = f"```sql\n{example.gold};\n```"
    result = await run(example.task(), LLM(url, "episode-key"))
    assert result == {"output": {"sql": example.gold, "queries": 1, "calls": 2}}
    # the fake checker replies with the query, which says no WRONG: accepted
    assert [r["model"] for r in cfg.requests] == ["writer", "checker"]
    assert cfg.requests[0].get("max_completion_tokens", cfg.requests[0].get("max_tokens")) == 96, (
        cfg.requests[0]
    )


@pytest.mark.timeout(60)
async def test_failing_queries_are_rewritten_up_to_the_limit_concurrently(
    bench: Benchmark, upstream: tuple[FakeUpstreamConfig, str]
) -> None:
    from examples.demo_agents.sql_agent.agent import run

    cfg, url = upstream
    cfg.reply = "SELEC nothing"
    tasks = [e.task() for e in bench.examples]
    results = await asyncio.gather(*(run(t, LLM(url, f"k{i}")) for i, t in enumerate(tasks)))
    assert [r["output"] for r in results] == [{"sql": "SELEC nothing", "queries": 3, "calls": 6}] * len(tasks)
    models = [r["model"] for r in cfg.requests]
    assert models.count("writer") == len(tasks) and models.count("rewriter") == 2 * len(tasks)
    assert models.count("checker") == 3 * len(tasks)


async def test_a_task_without_a_database_is_refused() -> None:
    from examples.demo_agents.sql_agent.agent import run

    with pytest.raises(ValueError, match=r"task\.input"):
        await run({"task_id": "t", "input": {"question": "?"}}, LLM("http://127.0.0.1:9/v1", "k"))
