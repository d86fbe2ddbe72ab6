"""Selective training in a multi-agent program, end to end: the LangGraph SQL agent (real ``langgraph`` +
``langchain-openai``, unchanged) run by the worker as a command, through the gateway over HTTP. Its
writer and rewriter are served by the embedded engine (a tiny model built here), its checker is routed
by model name to a second, fixed upstream (the fake vLLM-compatible server on its own port: the "hosted
model"). The reward service trains only ``writer,rewriter``. Every call is recorded with the upstream
that answered it; only writer/rewriter calls become transitions; the checker's are counted context."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from examples.demo_agents.sql_agent.data import generate
from flywheel.stack import EmbeddedStack, StackSettings
from gateway.server import GatewayServer
from gateway.upstream.client import make_upstream
from schemas import (
    EPISODES,
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStatus,
    LLMCallRecorded,
    RolloutRequested,
    Task,
    UpstreamKind,
)
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream
from tests.unit.worker.collect import Events

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

EPISODES_RUN = 2


async def test_sql_agent_trains_writer_and_rewriter_not_the_routed_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app
    from trainer.models.tiny import build_tiny

    bench = generate(tmp_path / "dbs", seed=1, databases=2, questions_per_db=3)
    corpus = [f"{e.question} {e.gold}" for e in bench.examples] * 4
    model_dir = build_tiny(
        tmp_path / "tiny", corpus, vocab_size=400, hidden=32, layers=1, heads=2, kv_heads=1
    )
    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=2048)
    monkeypatch.setenv("SQL_AGENT_MAX_TOKENS", "12")
    monkeypatch.setenv("OPENAI_CHECKER_MODEL", "checker")
    # the fixed model always complains, so every episode takes the rewrite path to its query limit
    fixed = FakeUpstreamConfig(reply="WRONG: the query does not answer the question.", use_tools=False)
    fixed_server = GatewayServer(create_fake_upstream(fixed), port=0)
    fixed_url = await fixed_server.start() + "/v1"
    settings = StackSettings(
        data_dir=tmp_path / "gw",
        episode_wait_s=5.0,
        upstream_timeout_s=60.0,
        upstream_kind=UpstreamKind.embedded,
        gateway_model_routes=f"checker=vllm+{fixed_url}",
        concurrency=EPISODES_RUN,
        train_models="writer,rewriter",
        run_trainer=False,
        record_events=False,
    )
    policy = make_upstream(
        "http://engine/v1",
        kind=UpstreamKind.embedded,
        timeout_s=60.0,
        transport=httpx.ASGITransport(app=create_engine_app(engine)),
    )
    try:
        async with EmbeddedStack(settings, upstream=policy) as stack:
            bus = stack.buses[0]
            events = await Events().attach(bus, EPISODES, TRANSITIONS, group="sql-e2e")
            try:
                agent = AgentRef(
                    kind=AgentKind.command, spec=f"{sys.executable} -m examples.demo_agents.sql_agent.agent"
                )
                for i, example in enumerate(bench.examples[:EPISODES_RUN]):
                    await bus.publish(
                        TASKS,
                        RolloutRequested(
                            task=Task.model_validate(example.task()),
                            agent=agent,
                            group_id=f"g{i}",
                            deadline_s=240.0,
                        ),
                    )
                scored: list[EpisodeScored] = await events.wait_for(
                    EpisodeScored, count=EPISODES_RUN, within_s=360
                )
            finally:
                await events.stop()
    finally:
        await fixed_server.stop()
        await engine.close()

    finished = {f.episode_id: f for f in events.of(EpisodeFinished)}
    calls: list[LLMCallRecorded] = events.of(LLMCallRecorded)
    for s in scored:
        done = finished[s.episode_id]
        assert done.status is EpisodeStatus.ok, done.error
        assert isinstance(done.output, dict)
        # garbage SQL from the tiny model: the agent handled it and stopped at its query limit
        assert done.output["queries"] == 3 and done.output["calls"] == 6
        mine = sorted((c for c in calls if c.episode_id == s.episode_id), key=lambda c: c.call_seq)
        assert [c.call_seq for c in mine] == list(range(6)) == list(range(s.num_calls))  # every call recorded
        assert [c.model for c in mine] == ["writer", "checker", "rewriter", "checker", "rewriter", "checker"]
        for c in mine:
            assert c.status_code == 200 and c.error is None
            body = json.loads(c.request)
            assert body["model"] == c.model  # recorded as the agent sent it
            if c.model == "checker":
                assert c.upstream_url == fixed_url and c.upstream is UpstreamKind.vllm
            else:
                assert c.upstream_url == "http://engine/v1" and c.upstream is UpstreamKind.embedded
                assert c.token_faithful
        trained = sorted(seq for t in s.transitions for seq in t.call_seqs)
        assert trained == [c.call_seq for c in mine if c.model != "checker"] == [0, 2, 4]
        assert s.context_calls == 3 and s.unusable_reason is None
        assert s.reward in (0.0, 1.0) and s.reward_source == "sql"  # execution match, not the agent
    assert len(fixed.requests) == 3 * EPISODES_RUN  # the fixed model saw only the checker's calls
    assert {r["model"] for r in fixed.requests} == {"checker"}
