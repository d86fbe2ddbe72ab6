"""Agents written in six frameworks, unchanged, through the real rollout stack and the embedded engine.

Each example in ``examples/framework_agents/`` runs as the worker runs any command agent (its own
process, ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY`` pointing
at the gateway's episode URL), each speaking its framework's default protocol (chat completions, the
Responses API, Anthropic's Messages API), against the real
gateway over HTTP, in front of the embedded engine serving a locally built tiny model; the reward
service scores and assembles. A tiny random model never writes a tool call, so the engine forces the
replies a trained model would write (``forced_output``, infra/engine/forcing.py; the script is
tests/e2e/framework_script.py) — token ids and logprobs stay the model's own. What is under test is
everything else: the framework's own tool loop (it parses the engine's ``tool_calls``, streamed or
not, runs the tool and sends the result back, which the chat template renders), token-faithful
capture of every call, and whether each framework's re-rendered history keeps the extension property
so that its calls merge into one trajectory (``prefix_mismatches`` otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from flywheel.stack import EmbeddedStack, StackSettings
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
    ScorerSpec,
    Task,
    UpstreamKind,
)
from tests.e2e import framework_script
from tests.unit.worker.collect import Events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "framework_agents"
# (test id, example file and arguments, the module it needs, streamed?, the protocol it speaks)
FRAMEWORKS = [
    ("openai-agents", "openai_agents_sdk.py", "agents", True, "responses"),
    ("openai-agents-no-stream", "openai_agents_sdk.py --no-stream", "agents", False, "responses"),
    ("openai-agents-chained", "openai_agents_sdk.py --no-stream --chain", "agents", False, "responses"),
    ("autogen", "autogen_agent.py", "autogen_agentchat", True, "chat.completions"),
    ("crewai", "crewai_agent.py", "crewai", False, "chat.completions"),
    ("langgraph", "langgraph_agent.py", "langgraph", False, "chat.completions"),
    ("anthropic", "anthropic_agent.py", "anthropic", False, "messages"),
    ("langgraph-anthropic", "langgraph_anthropic_agent.py", "langchain_anthropic", False, "messages"),
]
QUESTIONS = [(3, 4, 5), (6, 7, 2)]
CORPUS = [
    "You are a calculator. Use the multiply tool for every product, then state the result. "
    "Multiply two integers and return the product. What is the answer? The final product.",
    '{"type": "function", "function": {"name": "multiply", "description": "", "parameters": '
    '{"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], '
    '"type": "object"}}}',
    framework_script.tool_call(12, 5),
] * 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    return build_tiny(
        tmp_path_factory.mktemp("tiny") / "model",
        CORPUS,
        vocab_size=600,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        max_positions=8192,  # CrewAI's prompts run to a few thousand of these small-vocabulary tokens
    )


@pytest.fixture(params=["tokens_in", "rendered"])
async def stack(
    request: pytest.FixtureRequest, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[EmbeddedStack]:
    """The gateway with tokens-in (gateway/upstream/tokens_in.py: a call that extends the previous one exactly
    starts from its recorded ids) and without (every prompt rendered from the messages)."""
    import httpx

    from gateway.upstream.client import make_upstream
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app
    from infra.engine.forcing import scripted_replies

    # No telemetry or trace uploads from the agents' processes (the machine is offline anyway).
    for name, value in {
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "OTEL_SDK_DISABLED": "true",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }.items():
        monkeypatch.setenv(name, value)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    engine = InferenceEngine.from_pretrained(
        tiny_dir, max_model_len=8192, forced_output=scripted_replies(tok, framework_script.reply)
    )
    upstream = make_upstream(
        "http://fake/v1",
        kind=UpstreamKind.embedded,
        timeout_s=120.0,
        transport=httpx.ASGITransport(app=create_engine_app(engine)),
    )
    settings = StackSettings(
        data_dir=tmp_path,
        concurrency=len(QUESTIONS),
        tokens_in=request.param == "tokens_in",
        upstream_timeout_s=120.0,
        run_trainer=False,
        record_events=False,
    )
    try:
        async with EmbeddedStack(settings, upstream=upstream) as s:
            yield s
    finally:
        await engine.close()


def merge_stats(calls: list[LLMCallRecorded], scored: EpisodeScored) -> dict[str, int]:
    """How the episode's calls assembled. ``kept``: calls that extended the trajectory before them;
    ``broke``: prefix mismatches; ``refed_tokens``: the prompt tokens of every transition after the
    first, which a merged trajectory would have held once (the cost of the breaks)."""
    return {
        "calls": len(calls),
        "kept": len(calls) - len(scored.transitions),
        "broke": scored.prefix_mismatches,
        "transitions": len(scored.transitions),
        "refed_tokens": sum(len(t.prompt_ids) for t in scored.transitions[1:]),
        "training_tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in scored.transitions),
    }


def check_answer_body(body: dict[str, Any], endpoint: str, tool_call: bool) -> None:
    """The response as the agent got it, in its own protocol."""
    if endpoint == "responses":
        kinds = [item["type"] for item in body["output"]]
        assert body["object"] == "response" and body["status"] == "completed"
        assert kinds == (["function_call"] if tool_call else ["message"]), body
    elif endpoint == "messages":
        assert body["type"] == "message" and body["stop_reason"] == ("tool_use" if tool_call else "end_turn")
        assert [b["type"] for b in body["content"]] == (["tool_use"] if tool_call else ["text"]), body
    else:
        assert body["choices"][0]["finish_reason"] == ("tool_calls" if tool_call else "stop")


@pytest.mark.parametrize(
    ("framework", "script", "module", "streamed", "endpoint"), FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS]
)
async def test_framework_agent_tool_loop_through_the_stack(
    stack: EmbeddedStack,
    tiny_dir: Path,
    framework: str,
    script: str,
    module: str,
    streamed: bool,
    endpoint: str,
) -> None:
    tokens_in = stack.settings.gateway.tokens_in
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: uv sync --extra examples")
    bus = stack.buses[0]
    events = await Events().attach(bus, EPISODES, TRANSITIONS, group=f"fw-{framework}")
    agent = AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {AGENTS / script}")
    for i, (a, b, c) in enumerate(QUESTIONS):
        question = framework_script.QUESTION.format(a=a, b=b, c=c)
        task = Task(
            task_id=f"{framework}-{i}",
            input={"question": question},
            answer=framework_script.answer_text(a * b * c),
            scorer=ScorerSpec(name="exact"),
        )
        await bus.publish(
            TASKS, RolloutRequested(task=task, agent=agent, group_id=f"g-{framework}-{i}", deadline_s=240)
        )
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=len(QUESTIONS), within_s=270)
    finished = {e.episode_id: e for e in events.of(EpisodeFinished)}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tok_eos = None
    table = []
    for s in sorted(scored, key=lambda s: s.task_id or ""):
        a, b, c = QUESTIONS[int((s.task_id or "").rsplit("-", 1)[1])]
        compact = (a, b, c) in framework_script.COMPACT
        done = finished[s.episode_id]
        assert done.status is EpisodeStatus.ok, done.error
        assert isinstance(done.output, dict)
        # the framework ran the tool twice, with the arguments the model wrote
        assert done.output["tool_calls"] == [{"a": a, "b": b}, {"a": a * b, "b": c}]
        assert s.reward == 1.0 and s.reward_source == "exact", done.output
        calls = sorted(events.of(LLMCallRecorded, episode_id=s.episode_id), key=lambda c: c.call_seq)
        assert len(calls) == s.num_calls == 3
        for call, expected in zip(
            calls,
            [
                framework_script.tool_call(a, b, compact),
                framework_script.tool_call(a * b, c, compact),
                framework_script.answer_text(a * b * c),
            ],
            strict=True,
        ):
            assert (
                call.token_faithful and call.upstream is UpstreamKind.embedded and call.streamed is streamed
            )
            assert call.endpoint == endpoint
            [choice] = call.choices
            ids, lps = choice.token_ids or [], choice.logprobs or []
            assert len(ids) == len(lps) > 0 and all(-1e4 < lp <= 0.0 for lp in lps)
            assert ids[:-1] == tokenizer.encode(expected, add_special_tokens=False)  # what the model emitted
            check_answer_body(json.loads(call.response or "{}"), endpoint, expected.startswith("<tool_call>"))
            message = choice.message  # the engine's reply as a chat message, whatever the protocol
            assert isinstance(message, dict)
            if expected.startswith("<tool_call>"):
                assert choice.finish_reason == "tool_calls"
                assert [t["function"]["name"] for t in message["tool_calls"]] == ["multiply"]
            else:
                assert message["content"] == expected
            tok_eos = ids[-1] if tok_eos is None else tok_eos
            assert ids[-1] == tok_eos  # each reply ends with the end-of-turn token the engine emitted
        if "--chain" in script:  # the SDK sent only the new items, naming the response they follow
            chained = [json.loads(c.request).get("previous_response_id") for c in calls]
            assert chained[0] is None and chained[1:] == [json.loads(c.response)["id"] for c in calls[:-1]]
        stats = merge_stats(calls, s)
        assert stats["kept"] + stats["broke"] == len(calls) - 1
        # Every framework resends the history as messages, re-rendered by the template: canonical tool
        # JSON re-renders to the very tokens generated (one trajectory), compact JSON does not — unless
        # the engine starts from the recorded ids (tokens-in), when every history merges.
        if compact and not tokens_in:
            assert (stats["transitions"], stats["broke"]) == (3, 2), stats
            assert [c.prefix_mismatch for c in calls] == [False, True, True]
        else:
            assert (stats["transitions"], stats["broke"]) == (1, 0), stats
            assert s.transitions[0].call_seqs == [0, 1, 2]
            assert [c.extends_previous for c in calls][1:] == [True, True]
        for t in s.transitions:
            assert len(t.response_ids) == len(t.response_mask) == len(t.behaviour_logprobs)
        table.append({"json": "compact" if compact else "canonical", **stats})
    mode = "tokens-in" if tokens_in else "rendered"
    print(f"\nFRAMEWORK-MERGE {framework} {endpoint} {mode} {json.dumps(table)}")
    await events.stop()
