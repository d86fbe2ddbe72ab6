"""The lean callable agent (hand-written HTTP/1.1 over pooled connections) against the fake upstream."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
import uvicorn

from examples.agents_for_tests import lean_agent
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream
from tests.fakes.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, FakeUpstreamConfig]]:
    cfg = FakeUpstreamConfig(use_tools=False)
    port = free_port()
    # keep-alive of 1 s: the server closes idle pooled connections during the test
    server = uvicorn.Server(
        uvicorn.Config(
            create_fake_upstream(cfg),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            timeout_keep_alive=1,
        )
    )
    serving = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, what="the fake upstream to start")  # uvicorn has no event
    yield f"http://127.0.0.1:{port}/v1", cfg
    server.should_exit = True
    await serving
    for conns in lean_agent._IDLE.values():
        for _, writer in conns:
            writer.close()
    lean_agent._IDLE.clear()


@pytest.mark.timeout(20)
async def test_three_calls_on_one_pooled_connection(upstream: tuple[str, FakeUpstreamConfig]) -> None:
    url, cfg = upstream
    llm = SimpleNamespace(base_url=url, api_key="k", model="m")
    result = await lean_agent.run({"task_id": "t", "input": {"calls": 3, "reward": 0.5}}, llm)
    assert result == {"output": cfg.reply, "reward": 0.5}
    assert [len(r["messages"]) for r in cfg.requests] == [1, 3, 5]  # one growing conversation
    assert sum(len(c) for c in lean_agent._IDLE.values()) == 1  # all three calls reused one connection


@pytest.mark.timeout(20)
async def test_a_connection_the_server_closed_is_replaced(upstream: tuple[str, FakeUpstreamConfig]) -> None:
    url, cfg = upstream
    llm = SimpleNamespace(base_url=url, api_key="k", model="m")
    await lean_agent.run({"input": {"calls": 1}}, llm)
    await asyncio.sleep(1.3)  # past the server's keep-alive: the pooled connection is closed
    assert await lean_agent.run({"input": {"calls": 1}}, llm) == {"output": cfg.reply}


@pytest.mark.timeout(20)
async def test_http_errors_raise(upstream: tuple[str, FakeUpstreamConfig]) -> None:
    url, cfg = upstream
    cfg.fail_next = [500]
    with pytest.raises(lean_agent.HTTPError) as info:
        await lean_agent.run({"input": {"calls": 1}}, SimpleNamespace(base_url=url, api_key="k", model="m"))
    assert info.value.status == 500
