"""OpenTelemetry GenAI export, read back from a real Arize Phoenix (docs/observability.md).

The test command builds Phoenix in its own environment (``infra/scripts/phoenix_env.sh``,
``FLYWHEEL_PHOENIX_ENV``); this module starts ``phoenix serve`` on free ports with its working
directory in a temporary folder, runs the embedded stack with ``FLYWHEEL_OTLP_ENDPOINT`` pointing at
it, has a callable agent make real chat calls through the gateway (the ``openai`` SDK) in a group of
two episodes, report a reward per call and finish, lets the reward service score them, and reads the
spans back through Phoenix's REST API (``GET /v1/projects/default/spans``).

Without Phoenix the test is skipped, unless ``FLYWHEEL_REQUIRE_PHOENIX=1`` (the test command sets it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.base import Message
from infra.otel.spans import trace_id_for
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

pytestmark = [pytest.mark.slow, pytest.mark.phoenix, pytest.mark.timeout(420)]

AGENT = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.per_call_agent:run")
PROJECT = "default"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live ``phoenix serve`` (its URL), from FLYWHEEL_PHOENIX_ENV; stopped after the module."""
    env_dir = Path(
        os.environ.get("FLYWHEEL_PHOENIX_ENV", Path.home() / ".cache" / "flywheel" / "venv-phoenix")
    )
    exe = env_dir / "bin" / "phoenix"
    if not exe.exists():
        reason = f"Arize Phoenix is not installed at {env_dir} (bash infra/scripts/phoenix_env.sh)"
        if os.environ.get("FLYWHEEL_REQUIRE_PHOENIX") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOWED_SANDBOX_PROVIDERS": "NONE",  # no WASM sandbox download at start
    }
    log = (work / "phoenix.log").open("wb")
    proc = subprocess.Popen([str(exe), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (work / "phoenix.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "phoenix serve did not answer /healthz in 180 s"
            time.sleep(0.5)  # another process's readiness: nothing to wait on but its port
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _spans(url: str, trace_ids: set[str]) -> list[dict[str, Any]]:
    """Every span Phoenix holds for ``trace_ids`` (one page per trace: a handful of spans each)."""
    out: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for trace_id in sorted(trace_ids):
            r = await http.get(f"/v1/projects/{PROJECT}/spans", params={"trace_id": trace_id, "limit": 100})
            if r.status_code == 404:  # the project appears with its first span
                continue
            r.raise_for_status()
            out.extend(r.json()["data"])
    return out


async def _spans_when(
    url: str, trace_ids: set[str], ready: Any, timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = await _spans(url, trace_ids)
        if ready(spans) or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.5)  # Phoenix ingests in the background: poll its API


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


async def test_episodes_reach_phoenix_as_genai_spans_one_trace_each(phoenix: str, tmp_path: Path) -> None:
    from flywheel.cli.ops_up import TINY_CACHE, TINY_CORPUS
    from trainer.models.tiny import build_tiny

    model = await asyncio.to_thread(build_tiny, TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)
    settings = StackSettings(
        data_dir=tmp_path,
        record_events=False,
        run_trainer=False,
        gateway_port=0,
        otlp_endpoint=phoenix,
        otlp_capture_content=True,
    )
    task = Task(
        task_id="otel-task",
        input={"question": "What is 2 plus 3?", "call_rewards": [1.0, -1.0], "reward": 0.5},
        scorer=ScorerSpec(name="agent"),
    )
    scored: list[EpisodeScored] = []
    got_both = asyncio.Event()

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
            if len(scored) >= 2:
                got_both.set()

    async with EmbeddedStack(settings, model_dir=model) as stack:
        assert stack.bus is not None
        sub = await stack.bus.subscribe(TRANSITIONS, "otel-test", on_scored, from_beginning=True)
        for request in RolloutRequested.group(task, AGENT, 2, deadline_s=120):
            await stack.bus.publish(TASKS, request)
        await asyncio.wait_for(got_both.wait(), 240)
        await sub.stop()
        episodes = {s.episode_id for s in scored}
        traces = {trace_id_for(e): e for e in episodes}

        def complete(spans: list[dict[str, Any]]) -> bool:
            roots = [s for s in spans if not s["parent_id"]]
            return len(roots) == 2 and len(spans) == 6

        spans = await _spans_when(phoenix, set(traces), complete)

    assert {s["context"]["trace_id"] for s in spans} == set(traces), spans
    for trace_id, episode_id in traces.items():
        mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
        roots = [s for s in mine if not s["parent_id"]]
        assert len(roots) == 1, mine  # one episode span, its calls under it: one trace per episode
        root = roots[0]
        root_attrs = root["attributes"]
        assert root["name"] == f"invoke_agent {AGENT.spec}" and root["span_kind"] == "AGENT"
        assert root_attrs["gen_ai.operation.name"] == "invoke_agent"
        assert root_attrs["gen_ai.conversation.id"] == episode_id
        assert root_attrs["flywheel.reward"] == 0.5 and root_attrs["flywheel.reward_source"] == "agent"
        assert root_attrs["flywheel.status"] == "ok" and root_attrs["flywheel.task_id"] == "otel-task"
        assert int(root_attrs["flywheel.transitions"]) + int(root_attrs["flywheel.merged_calls"]) == 2
        calls = sorted((s for s in mine if s["parent_id"]), key=lambda s: _at(s["start_time"]))
        assert len(calls) == 2 and all(c["parent_id"] == root["context"]["span_id"] for c in calls)
        response_ids = []
        for seq, call in enumerate(calls):
            a = call["attributes"]
            assert (
                call["name"] == "chat policy" and call["span_kind"] == "LLM"
            )  # Phoenix maps gen_ai.* to its kinds
            assert a["gen_ai.operation.name"] == "chat"
            assert a["gen_ai.request.model"] == "policy" and a["gen_ai.response.model"] == "policy"
            assert int(a["gen_ai.usage.input_tokens"]) > 0 and int(a["gen_ai.usage.output_tokens"]) > 0
            assert a["gen_ai.response.finish_reasons"] and set(a["gen_ai.response.finish_reasons"]) <= {
                "stop",
                "length",
            }
            assert a["gen_ai.conversation.id"] == episode_id
            assert int(a["flywheel.call_seq"]) == seq and int(a["flywheel.weight_version"]) == 0
            assert a["flywheel.token_faithful"] is True and float(a["flywheel.logprob.min"]) <= 0
            assert "flywheel.extends_previous" in a or seq == 0
            messages = orjson.loads(a["gen_ai.input.messages"])  # content: FLYWHEEL_OTLP_CAPTURE_CONTENT
            assert messages[0]["parts"][0]["content"] == "What is 2 plus 3?"
            assert len(messages) == 1 + 2 * seq
            response_ids.append(a["gen_ai.response.id"])
            assert _at(root["start_time"]) <= _at(call["start_time"]) <= _at(call["end_time"])
            assert _at(call["end_time"]) <= _at(root["end_time"])
        evaluations = [e for e in root["events"] if e["name"] == "gen_ai.evaluation.result"]
        by_name: dict[str, list[dict[str, Any]]] = {}
        for e in evaluations:
            ea = e["attributes"]
            by_name.setdefault(ea["gen_ai.evaluation.name"], []).append(ea)
        # the agent's two per-call rewards (each naming the response it is for) and the episode's score
        per_call = sorted(by_name["agent"], key=lambda a: int(a.get("flywheel.call_seq", 99)))
        assert [float(a["gen_ai.evaluation.score.value"]) for a in per_call] == [1.0, -1.0, 0.5]
        assert [a.get("gen_ai.response.id") for a in per_call[:2]] == response_ids
