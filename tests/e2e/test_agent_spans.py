"""An agent's own OpenTelemetry spans, through the gateway's OTLP intake, into its episode and the event log.

A real OpenAI Agents SDK agent (``examples/framework_agents/openai_agents_traced.py``) runs as the
worker runs any command agent, against the embedded stack (its gateway over HTTP, the embedded engine
forcing the calculator script's replies as in tests/e2e/test_framework_agents.py, the reward service,
the recorder on chdb). Its tracing goes through OpenInference's instrumentor to OpenTelemetry's
OTLP/HTTP exporter, pointed at ``OPENAI_BASE_URL + "/traces"``: the episode's signed URL. What is
checked is what the library sent, as the episode holds it: the agent, model-call and tool spans in one
tree, tool durations, the spans on ``flywheel.episodes`` as ``AgentSpansRecorded`` beside the calls,
and one row per span in the event log's ``agent_spans`` table.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import JsonValue

from flywheel.stack import EmbeddedStack, StackSettings
from schemas import (
    EPISODES,
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    AgentSpansRecorded,
    EpisodeScored,
    LLMCallRecorded,
    RolloutRequested,
    ScorerSpec,
    Task,
    UpstreamKind,
)
from tests.e2e import framework_script
from tests.e2e.test_framework_agents import CORPUS
from tests.unit.worker.collect import Events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENT = Path(__file__).resolve().parents[2] / "examples" / "framework_agents" / "openai_agents_traced.py"


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EmbeddedStack]:
    import httpx
    from transformers import AutoTokenizer

    from gateway.upstream.client import make_upstream
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app
    from infra.engine.forcing import scripted_replies
    from trainer.models.tiny import build_tiny

    for name in ("OTEL_SDK_DISABLED", "OPENAI_AGENTS_DISABLE_TRACING", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)  # the agent's tracing is what is under test
    model = await asyncio.to_thread(
        build_tiny, tmp_path / "model", CORPUS, vocab_size=600, hidden=32, layers=1, heads=2, kv_heads=1,
        max_positions=4096,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model)
    engine = InferenceEngine.from_pretrained(
        model, max_model_len=4096, forced_output=scripted_replies(tok, framework_script.reply)
    )
    upstream = make_upstream(
        "http://engine/v1",
        kind=UpstreamKind.embedded,
        timeout_s=120.0,
        transport=httpx.ASGITransport(app=create_engine_app(engine)),
    )
    settings = StackSettings(data_dir=tmp_path / "stack", run_trainer=False, upstream_timeout_s=120.0)
    try:
        async with EmbeddedStack(settings, upstream=upstream) as s:
            yield s
    finally:
        await engine.close()


async def test_an_agents_sdk_agents_spans_land_in_its_episode_beside_its_calls(stack: EmbeddedStack) -> None:
    assert stack.store is not None
    bus = stack.buses[0]
    events = await Events().attach(bus, EPISODES, TRANSITIONS, group="agent-spans")
    task = Task(
        task_id="traced-0",
        input={"question": framework_script.QUESTION.format(a=3, b=4, c=5)},
        answer=framework_script.answer_text(60),
        scorer=ScorerSpec(name="exact"),
    )
    agent = AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {AGENT}")
    await bus.publish(TASKS, RolloutRequested(task=task, agent=agent, group_id="g-traced", deadline_s=240))
    [scored] = await events.wait_for(EpisodeScored, count=1, within_s=270)
    episode_id = scored.episode_id
    assert scored.reward == 1.0, scored

    calls = sorted(events.of(LLMCallRecorded, episode_id=episode_id), key=lambda c: c.call_seq)
    recorded = events.of(AgentSpansRecorded, episode_id=episode_id)
    assert recorded and {(e.via, e.matched_by) for e in recorded} == {("ticket", "url")}
    spans = [s for e in recorded for s in e.spans]
    kind = {s.span_id: s.attributes.get("openinference.span.kind") for s in spans}

    # the library's own tree: one trace, every parent in it, the agent's run at the root
    assert len({s.trace_id for s in spans}) == 1
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id is None or s.parent_span_id not in ids]
    assert len(roots) == 1 and kind[roots[0].span_id] == "AGENT", [(s.name, kind[s.span_id]) for s in spans]
    agents = [s for s in spans if kind[s.span_id] == "AGENT" and s.name == "calculator"]
    assert len(agents) == 1 and agents[0].service_name == "calculator"
    # agent steps: one LLM span per recorded call, and the two tool calls with their durations
    llm = sorted((s for s in spans if kind[s.span_id] == "LLM"), key=lambda s: s.start_time)
    assert len(llm) == len(calls) == 3
    tools = sorted((s for s in spans if kind[s.span_id] == "TOOL"), key=lambda s: s.start_time)
    assert [t.name for t in tools] == ["multiply", "multiply"]
    assert all(t.duration_ms >= 20.0 and t.status != "error" for t in tools), tools
    # each tool ran between the model call that asked for it and the next one
    for n, tool in enumerate(tools):
        assert llm[n].end_time <= tool.start_time <= tool.end_time <= llm[n + 1].start_time
        started = calls[n + 1].started_at
        assert started is None or tool.end_time <= started

    # the event log: one row per span in agent_spans, the tool durations queryable beside the calls
    db = stack.store.database
    sql = (
        "SELECT name, duration_ms, JSONExtractString(attributes, 'openinference.span.kind') AS kind "
        f"FROM {db}.agent_spans FINAL WHERE episode_id = '{episode_id}' ORDER BY start_time"
    )
    rows: list[list[JsonValue]] = []
    for _ in range(200):
        rows = (await asyncio.to_thread(stack.store.query, sql)).rows
        if len(rows) >= len(spans):
            break
        await asyncio.sleep(0.1)  # the recorder writes in batches: poll the table it fills
    assert len(rows) == len(spans)
    logged = [(r[0], r[1]) for r in rows if r[2] == "TOOL"]
    assert [name for name, _ in logged] == ["multiply", "multiply"]
    assert [d for _, d in logged] == pytest.approx([t.duration_ms for t in tools])
    calls_logged = await asyncio.to_thread(
        stack.store.query,
        f"SELECT count() FROM {db}.events FINAL WHERE episode_id = '{episode_id}' AND type = 'llm_call_recorded'",
    )
    assert calls_logged.rows == [[3]]
    await events.stop()
