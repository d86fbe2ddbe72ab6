"""Agent Lightning's own agents, unchanged, run by Flywheel's worker against the embedded engine.

The agent is ``examples/gsm8k/gsm8k_agent.py:ChatAgent`` from AGL 1.0.2's sdist (fetched by pip, see
``tests/compat/agl_env.py``), run as the task's command agent ``flywheel agl-agent … ChatAgent``: the
real worker (the embedded stack's ``RolloutWorker``, as ``flywheel worker`` runs it) spawns it in its
own process group with AGL's environment (``AGL_OPENAI_BASE_URL``, ``AGL_EVENT_URL``, ``AGL_KEY``, the
``env_map`` entries), it calls the gateway with the real ``openai`` SDK (the toy model's answer is
wrong, as expected) and posts its reward event; the reward service scores the episode from that event.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from infra.bus.base import Message
from infra.stack import EmbeddedStack, StackSettings
from schemas import (
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeScored,
    RolloutRequested,
    ScorerSpec,
    Task,
)
from tests.compat.agl_env import agl_sdist

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
QUESTION = "Natalia sold clips to 48 friends in April, and half as many in May. How many clips in all?"


def _agent(sdist: Path, agent_class: str) -> AgentRef:
    gsm8k = sdist / "examples" / "gsm8k"
    spec = (
        f"{FLYWHEEL} agl-agent --path {gsm8k} --env-map QUESTION=input.question "
        f"--env-map ANSWER=input.answer gsm8k_agent:{agent_class}"
    )
    return AgentRef(kind=AgentKind.command, spec=spec)


async def test_gsm8k_chat_agent_unchanged_is_scored_from_its_own_reward_event(tmp_path: Path) -> None:
    sdist = agl_sdist()
    from infra.cli.ops_up import TINY_CACHE, TINY_CORPUS
    from trainer.models.tiny import build_tiny

    model = await asyncio.to_thread(build_tiny, TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)
    settings = StackSettings(data_dir=tmp_path, run_trainer=False, record_events=False, gateway_port=0)
    scored: list[EpisodeScored] = []
    done = asyncio.Event()

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored) and msg.event.group_id == "agl-gsm8k":
            scored.append(msg.event)
            if len(scored) == 2:
                done.set()

    async with EmbeddedStack(settings, model_dir=model) as stack:
        assert stack.bus is not None
        sub = await stack.bus.subscribe(TRANSITIONS, "agl-test", on_scored, from_beginning=True)
        task = Task(
            task_id="gsm8k-0", input={"question": QUESTION, "answer": "72"}, scorer=ScorerSpec(name="agent")
        )
        for i in range(2):
            await stack.bus.publish(
                TASKS,
                RolloutRequested(
                    task=task,
                    agent=_agent(sdist, "ChatAgent"),
                    group_id="agl-gsm8k",
                    group_size=2,
                    sample_index=i,
                    deadline_s=240,
                ),
            )
        await asyncio.wait_for(done.wait(), 400)
        await sub.stop()
    for ep in scored:
        assert ep.status.value == "ok", ep
        assert ep.reward_source == "agent" and ep.reward == 0.0  # its own reward event: wrong answer, 0.0
        assert ep.num_calls == 1 and ep.transitions and ep.transitions[0].response_ids


CALC_DEPS = (
    "autogen_agentchat",
    "autogen_ext.models.openai",
    "autogen_ext.tools.mcp",
    "mcp_server_calculator",
)


def _calc_python() -> Path:
    """AGL's venv with calc_x's dependencies (AutoGen, the MCP calculator server), installed once."""
    import subprocess

    from tests.compat.agl_env import agl_python, clean_env, unavailable

    python = agl_python()
    probe = [str(python), "-c", "import " + ", ".join(CALC_DEPS)]
    if subprocess.run(probe, env=clean_env(), capture_output=True, check=False).returncode != 0:
        deps = [
            "autogen-agentchat",
            "autogen-ext[openai]",
            "mcp>=1.11.0,<2",
            "mcp-server-calculator",
            "sympy",
        ]
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *deps],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            unavailable(f"calc_x dependencies did not install: {done.stderr.strip().splitlines()[-1:]}")
    return python


async def test_calc_x_autogen_agent_runs_its_tool_rollout_through_the_worker(tmp_path: Path) -> None:
    """AGL's calc_x ``Agent`` (AutoGen ``AssistantAgent`` + the MCP calculator over stdio), unchanged,
    in its own 3.12 venv: the fake model calls the calculator, AutoGen runs it through MCP, reflects on
    the result in a second call, and the agent posts its reward (the fake's answer is wrong: 0.0)."""
    from tests.e2e.rollouts_stack import RolloutStack
    from tests.fakes.upstream import FakeUpstreamConfig

    sdist = agl_sdist()
    python = _calc_python()
    fake = FakeUpstreamConfig(use_tools=True, tool_arguments='{"expression": "12 * 7"}')
    stack = await RolloutStack(tmp_path, fake=fake).start()
    scored: list[EpisodeScored] = []
    done = asyncio.Event()

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
            done.set()

    try:
        bus = await stack.bus()
        sub = await bus.subscribe(TRANSITIONS, "agl-calc", on_scored, from_beginning=True)
        spec = (
            f"{FLYWHEEL} agl-agent --python {python} --path {sdist / 'examples' / 'calc_x'} "
            "--env-map QUESTION=input.question --env-map RESULT=input.result calc_agent:Agent"
        )
        task = Task(task_id="calc-0", input={"question": "What is 12 times 7?", "result": "84"})
        await bus.publish(
            TASKS,
            RolloutRequested(
                task=task,
                agent=AgentRef(kind=AgentKind.command, spec=spec),
                group_id="agl-calc",
                deadline_s=200,
            ),
        )
        await asyncio.wait_for(done.wait(), 240)
        await sub.stop()
    finally:
        await stack.stop()
    [ep] = scored
    assert ep.status.value == "ok", ep
    assert ep.reward_source == "agent" and ep.reward == 0.0
    assert ep.num_calls == 2  # the tool call, then the reflection on the calculator's result
    requests = [r for r in fake.requests if r.get("messages")]
    tool_results = [m for m in requests[-1]["messages"] if m.get("role") == "tool"]
    assert tool_results and "84" in str(tool_results[0].get("content"))  # the MCP calculator ran
