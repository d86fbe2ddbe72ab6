"""Framework agents, unchanged programs, through the worker, the gateway and a live vLLM serving SmolLM2.

Each agent runs as the worker runs any command agent (its own process, ``OPENAI_BASE_URL`` at the
gateway's episode URL); its first call forces the tool (a named or ``required`` ``tool_choice``, which
vLLM turns into constrained decoding), the framework runs the tool and sends the result back, and the
model answers. The reward service scores each episode. Every call is recorded with vLLM's ids and
logprobs. Every follow-up call extends the previous one token for token (tokens-in: the gateway sends vLLM
the recorded ids, gateway/upstream/tokens_in.py), so each episode trains as one trajectory; the test prints how the
calls merged (``MERGE-FIGURES``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flywheel.stack import EmbeddedStack
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
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(600)

AGENTS = Path(__file__).parent / "agents"
FRAMEWORKS = [("langgraph", "langgraph_tool_first.py"), ("openai-agents", "agents_sdk_tool_first.py")]


@pytest.mark.parametrize(("framework", "script"), FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS])
async def test_framework_agent_through_worker_gateway_and_vllm(
    stack: EmbeddedStack, vllm_model_dir: Path, framework: str, script: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    bus = stack.buses[0]
    events = await Events().attach(bus, EPISODES, TRANSITIONS, group=f"vllm-{framework}")
    agent = AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {AGENTS / script}")
    questions = [(6, 7), (3, 9)]
    for i, (a, b) in enumerate(questions):
        task = Task(
            task_id=f"{framework}-{i}",
            input={"question": f"What is {a} times {b}?"},
            answer=str(a * b),
            scorer=ScorerSpec(name="numeric"),
        )
        await bus.publish(
            TASKS, RolloutRequested(task=task, agent=agent, group_id=f"g-{framework}-{i}", deadline_s=400)
        )
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=len(questions), within_s=500)
    finished = {e.episode_id: e for e in events.of(EpisodeFinished)}
    figures = {"calls": 0, "extended": 0, "broke": 0, "transitions": 0}
    for s in scored:
        done = finished[s.episode_id]
        assert done.status is EpisodeStatus.ok, done.error
        assert isinstance(done.output, dict) and done.output["tool_calls"], done.output  # the tool ran
        assert s.reward is not None and 0.0 <= s.reward <= 1.0
        calls = sorted(events.of(LLMCallRecorded, episode_id=s.episode_id), key=lambda c: c.call_seq)
        assert len(calls) == s.num_calls >= 2
        for prev, call in zip([None, *calls], calls, strict=False):
            assert call.upstream is UpstreamKind.vllm and call.token_faithful and call.status_code == 200
            [choice] = call.choices
            assert choice.token_ids and choice.logprobs and len(choice.token_ids) == len(choice.logprobs)
            assert call.prompt_token_ids and call.weight_version_source == "gateway"
            if prev is None:  # what vLLM saw is the agent's request, rendered
                request = json.loads(call.request)
                rendered = tokenizer.apply_chat_template(
                    request["messages"], tools=request.get("tools"), add_generation_prompt=True, tokenize=True
                )
                assert call.prompt_token_ids == list(
                    rendered["input_ids"] if hasattr(rendered, "keys") else rendered
                )
            else:  # tokens-in: the previous prompt and the ids the model wrote, then the framework's additions
                head = [*(prev.prompt_token_ids or []), *(prev.choices[0].token_ids or [])]
                assert call.extends_previous is True and call.prompt_token_ids[: len(head)] == head
        assert calls[0].choices[0].message["tool_calls"]  # type: ignore[index]
        figures["calls"] += len(calls)
        figures["extended"] += sum(1 for c in calls if c.extends_previous)
        figures["broke"] += s.prefix_mismatches
        figures["transitions"] += len(s.transitions)
    print(f"MERGE-FIGURES {json.dumps({'framework': framework, 'engine': 'vllm', **figures})}")
    await events.stop()
