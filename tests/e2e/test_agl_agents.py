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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.base import Message
from schemas import (
    AGL,
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    AglRecorded,
    EpisodeScored,
    RolloutRequested,
    ScorerSpec,
    Task,
)
from tests.compat.agl_env import agl_sdist
from tests.fakes.upstream import FakeUpstreamConfig, fake_upstream

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
    from flywheel.cli.ops_up import TINY_CACHE, TINY_CORPUS
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


async def _fake_stack(tmp_path: Path, fake: FakeUpstreamConfig) -> EmbeddedStack:
    """The embedded stack (gateway, one worker, reward service) in front of the fake model server;
    episode URLs carry plain ids (what the Kubernetes test expects in the pod's environment)."""
    settings = StackSettings(
        data_dir=tmp_path,
        run_trainer=False,
        record_events=False,
        gateway_port=0,
        make_episode_key=False,
        episode_wait_s=5.0,
    )
    stack = EmbeddedStack(settings, upstream=fake_upstream(fake))
    await stack.start()
    return stack


CALC_DEPS = (
    "autogen_agentchat",
    "autogen_ext.models.openai",
    "autogen_ext.tools.mcp",
    "mcp_server_calculator",
)


def _calc_python() -> Path:
    """AGL's venv with calc_x's dependencies (AutoGen, the MCP calculator server), installed once."""
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
    sdist = agl_sdist()
    python = _calc_python()
    fake = FakeUpstreamConfig(use_tools=True, tool_arguments='{"expression": "12 * 7"}')
    stack = await _fake_stack(tmp_path, fake)
    scored: list[EpisodeScored] = []
    done = asyncio.Event()

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
            done.set()

    try:
        bus = stack.buses[0]
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


class OneNodeKubelet:
    """A stand-in for the Kubernetes API and one node (no cluster here), named as such: creating a Job
    runs its first container's command as a local process with exactly the environment the rendered
    manifest gives it (``python`` → AGL's venv, first on ``PATH`` as in the image; ``/app`` → the sdist's
    ``calc_x`` directory, which is what calc_x's Dockerfile copies there); the Job's status and its pod's
    log are that process's."""

    def __init__(self, python: Path, app_dir: Path, workdir: Path) -> None:
        self.python, self.app_dir, self.workdir = python, app_dir, workdir
        self.jobs: dict[str, Any] = {}
        self.manifests: list[dict[str, Any]] = []

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        from tests.compat.agl_env import clean_env

        self.manifests.append(body)
        [container] = body["spec"]["template"]["spec"]["containers"]
        argv = [
            str(self.python) if part == "python" else part.replace("/app", str(self.app_dir))
            for part in container["command"]
        ]
        env = clean_env() | {e["name"]: e["value"] for e in container["env"]}
        env["PATH"] = f"{self.python.parent}:{env.get('PATH', '')}"  # the image's python comes first
        name = body["metadata"]["name"]
        log = open(self.workdir / f"{name}.log", "w+")  # noqa: SIM115 - the process writes it until it ends
        self.jobs[name] = (subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        return body

    def read_namespaced_job_status(self, name: str, namespace: str) -> dict[str, Any]:
        code = self.jobs[name][0].poll()
        return {"status": {} if code is None else {"succeeded": 1} if code == 0 else {"failed": 1}}

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str = "") -> None:
        self.jobs[name][0].kill()

    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> dict[str, Any]:
        return {"items": [{"metadata": {"name": name}} for name in self.jobs]}

    def read_namespaced_pod_log(self, name: str, namespace: str, tail_lines: int = 0) -> str:
        return (self.workdir / f"{name}.log").read_text()


async def test_calc_x_job_template_renders_as_agl_and_its_pod_is_scored_from_its_reward_event(
    tmp_path: Path,
) -> None:
    """AGL's ``examples/calc_x/job-template.yaml``, unchanged, as a Kubernetes agent: the worker renders
    it as AGL's controller does (``input.question | yaml_escape`` …), the pod's unchanged
    ``calc_agent.py`` calls the episode's gateway URL from ``AGL_OPENAI_BASE_URL`` and posts its reward
    to ``AGL_EVENT_URL`` (the gateway's ``/episodes/<id>/agl/events``), and that reward event scores
    the episode. Only the cluster is a stand-in (``OneNodeKubelet``)."""
    from rollout_worker.kubernetes_runner import KubernetesRunner

    sdist = agl_sdist()
    python = _calc_python()
    calc_x = sdist / "examples" / "calc_x"
    kubelet = OneNodeKubelet(python, calc_x, tmp_path)
    fake = FakeUpstreamConfig(use_tools=True, tool_arguments='{"expression": "12 * 7"}')
    stack = await _fake_stack(tmp_path, fake)
    stack.workers[0].runners[AgentKind.kubernetes] = KubernetesRunner(
        namespace="agents", poll_s=0.2, batch_api=kubelet, core_api=kubelet
    )
    scored: list[EpisodeScored] = []
    agl_events: list[AglRecorded] = []
    done = asyncio.Event()

    async def on_event(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
            done.set()
        elif isinstance(msg.event, AglRecorded):
            agl_events.append(msg.event)

    try:
        bus = stack.buses[0]
        await bus.ensure_topics([AGL])
        subs = [await bus.subscribe(t, "agl-k8s", on_event, from_beginning=True) for t in (TRANSITIONS, AGL)]
        task = Task(task_id="calc-k8s", input={"question": "What is 12 times 7?", "result": "84"})
        agent = AgentRef(kind=AgentKind.kubernetes, spec=str(calc_x / "job-template.yaml"))
        await bus.publish(TASKS, RolloutRequested(task=task, agent=agent, group_id="agl-k8s", deadline_s=200))
        await asyncio.wait_for(done.wait(), 240)
        for sub in subs:
            await sub.stop()
    finally:
        await stack.stop()
        for proc, log in kubelet.jobs.values():
            proc.kill()
            log.close()
    [manifest] = kubelet.manifests
    [container] = manifest["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["QUESTION"] == "What is 12 times 7?" and env["RESULT"] == "84"  # rendered from the input
    [ep] = scored
    assert env["AGL_OPENAI_BASE_URL"] == f"{stack.gateway_url}/episodes/{ep.episode_id}/v1"
    assert env["AGL_EVENT_URL"] == f"{stack.gateway_url}/episodes/{ep.episode_id}/agl/events"
    assert manifest["metadata"]["labels"]["agentlightning/rollout-id"] == ep.episode_id
    assert ep.status.value == "ok", ep
    assert (
        ep.reward_source == "agent" and ep.reward == 0.0
    )  # its own reward event: the fake's answer is wrong
    assert ep.num_calls == 2  # the tool call, then the reflection on the MCP calculator's result
    assert [e.data["event_type"] for e in agl_events if isinstance(e.data, dict)] == ["reward"]
