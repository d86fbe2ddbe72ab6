"""The command and callable runners on their own: results, deadlines, crashes, garbage."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import JsonValue

from rollout_worker.callable_runner import CallableRunner, load_callable
from rollout_worker.command_runner import CommandRunner, command_argv
from rollout_worker.llm import LLM
from rollout_worker.runners import AgentRun, AgentSpecError, parse_final_line, split_result
from schemas import AgentKind, AgentRef, EpisodeStatus

AGENTS = "examples/agents_for_tests"


def make_run(kind: AgentKind, spec: str, deadline_s: float = 10.0, task_input: JsonValue = None) -> AgentRun:
    ep = "ab" * 16
    return AgentRun(
        episode_id=ep,
        agent=AgentRef(kind=kind, spec=spec),
        task={"task_id": "t1", "input": task_input, "answer": None},
        llm=LLM(f"http://gw/episodes/{ep}/v1", ep, "policy"),
        deadline_s=deadline_s,
        deadline_at=datetime.now(UTC) + timedelta(seconds=deadline_s),
    )


def test_final_line_parsing() -> None:
    assert parse_final_line('noise\n{"reward": 1, "output": "x"}\n') == ("x", 1.0, True)
    assert parse_final_line('{"reward": 0.5}\nlater non-json') == (None, 0.5, True)
    assert parse_final_line('{"answer": 3}') == ({"answer": 3}, None, True)
    assert parse_final_line("garbage {not json\n") == (None, None, False)
    assert split_result({"reward": "high", "output": 1}) == (1, None)
    assert split_result({"reward": float("nan")})[1] is None
    assert split_result(5) == (5, None)


def test_command_argv_uses_worker_python() -> None:
    assert command_argv("python a.py --x 'y z'") == [sys.executable, "a.py", "--x", "y z"]
    with pytest.raises(AgentSpecError):
        command_argv("   ")
    with pytest.raises(AgentSpecError):
        command_argv("python 'unterminated")


@pytest.mark.timeout(20)
async def test_command_agent_gets_task_and_env_and_reports() -> None:
    script = (
        "import json,os,sys; t=json.loads(sys.stdin.readline()); e=json.loads(os.environ['FLYWHEEL_TASK']);"
        "print('hello');"
        "print(json.dumps({'reward': 0.75, 'output': [t['task_id'], e['input'], os.environ['OPENAI_BASE_URL'],"
        " os.environ['OPENAI_API_BASE'], os.environ['OPENAI_API_KEY']]}))"
    )
    run = make_run(AgentKind.command, f"python -c {json.dumps(script)}", task_input={"q": 1})
    result = await CommandRunner().run(run)
    assert result.status is EpisodeStatus.ok, result.error
    assert result.reward == 0.75
    assert result.output == ["t1", {"q": 1}, run.llm.base_url, run.llm.base_url, run.episode_id]


@pytest.mark.timeout(20)
async def test_crashing_agent_is_an_error_with_stderr_tail() -> None:
    result = await CommandRunner().run(make_run(AgentKind.command, f"python {AGENTS}/crashing_agent.py"))
    assert result.status is EpisodeStatus.error
    assert result.error is not None
    assert "exit code 3" in result.error and "broke on purpose" in result.error


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] == "Z"


@pytest.mark.timeout(20)
async def test_hanging_agent_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    runner = CommandRunner(kill_grace_s=0.5)
    t0 = time.monotonic()
    result = await runner.run(
        make_run(AgentKind.command, f"python {AGENTS}/hanging_agent.py {pid_file}", 1.5)
    )
    assert result.status is EpisodeStatus.timeout
    assert time.monotonic() - t0 < 6
    child = int(pid_file.read_text())
    for _ in range(50):  # the child is reaped by init shortly after SIGKILL
        if _gone(child):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the agent's child process survived the deadline")


@pytest.mark.timeout(20)
async def test_garbage_agent_is_recorded_and_memory_bounded() -> None:
    result = await CommandRunner(tail_chars=1000).run(
        make_run(AgentKind.command, f"python {AGENTS}/garbage_agent.py")
    )
    assert result.status is EpisodeStatus.ok
    assert result.reward is None or isinstance(result.reward, float)


async def test_missing_command_is_a_spec_error() -> None:
    with pytest.raises(AgentSpecError):
        await CommandRunner().run(make_run(AgentKind.command, "/nonexistent/agent-binary"))


async def test_callable_agents() -> None:
    runner = CallableRunner(threads=4)
    mod = "examples.agents_for_tests.async_callables"
    ok = await runner.run(make_run(AgentKind.callable, f"{mod}:instant", task_input={"x": 1}))
    assert ok.status is EpisodeStatus.ok and ok.reward == 1.0
    assert ok.output == {"echo": {"x": 1}, "base_url": f"http://gw/episodes/{'ab' * 16}/v1"}
    sync = await runner.run(make_run(AgentKind.callable, f"{mod}:sync_instant"))
    assert sync.status is EpisodeStatus.ok and sync.output == 0.5 and sync.reward is None
    slow = await runner.run(make_run(AgentKind.callable, f"{mod}:sleepy", deadline_s=0.2))
    assert slow.status is EpisodeStatus.timeout
    bad = await runner.run(make_run(AgentKind.callable, f"{mod}:broken"))
    assert bad.status is EpisodeStatus.error and bad.error is not None and "always fails" in bad.error
    await runner.aclose()


def test_bad_callable_specs() -> None:
    for spec in ["no_colon", "nonexistent_module_xyz:run", "examples.agents_for_tests.async_callables:nope"]:
        with pytest.raises(AgentSpecError):
            load_callable(spec)


@pytest.mark.timeout(20)
async def test_command_agent_runs_nicer_than_the_worker() -> None:
    script = "import os, json; print(json.dumps({'output': os.nice(0)}))"
    run = make_run(AgentKind.command, f"python -c {json.dumps(script)}")
    base = os.nice(0)
    nicer = await CommandRunner(nice=5).run(run)
    same = await CommandRunner().run(run)
    assert nicer.status is EpisodeStatus.ok and same.status is EpisodeStatus.ok, (nicer.error, same.error)
    assert (nicer.output, same.output) == (min(base + 5, 19), base)


@pytest.mark.timeout(20)
async def test_cancelled_command_agent_is_killed_with_its_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    runner = CommandRunner(kill_grace_s=0.5)
    task = asyncio.ensure_future(
        runner.run(make_run(AgentKind.command, f"python {AGENTS}/hanging_agent.py {pid_file}", 30))
    )
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    child = int(pid_file.read_text())
    for _ in range(50):
        if _gone(child):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the cancelled agent's child process survived")
    await runner.aclose()


@pytest.mark.timeout(20)
async def test_command_agent_exit_is_polled_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError("pidfd_open not supported")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    result = await CommandRunner().run(make_run(AgentKind.command, f"python {AGENTS}/crashing_agent.py"))
    assert result.status is EpisodeStatus.error and result.error is not None
    assert "exit code 3" in result.error


@pytest.mark.timeout(20)
async def test_many_command_agents_at_once() -> None:
    runner = CommandRunner()
    script = "import sys, json; t = json.loads(sys.stdin.readline()); print(json.dumps({'reward': 1, 'output': t}))"
    runs = [make_run(AgentKind.command, f"python -c {json.dumps(script)}", task_input=i) for i in range(12)]
    results = await asyncio.gather(*(runner.run(r) for r in runs))
    assert [r.status for r in results] == [EpisodeStatus.ok] * 12, [r.error for r in results]
    assert [r.output["input"] for r in results if isinstance(r.output, dict)] == list(range(12))
    await runner.aclose()


@pytest.mark.timeout(20)
async def test_cancelled_while_spawning_kills_what_was_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CommandRunner()
    spawned: list[subprocess.Popen[bytes]] = []
    popen = runner._popen

    def slow_popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        time.sleep(0.3)  # the cancellation lands while the fork/exec is still running
        spawned.append(popen(argv, env))
        return spawned[-1]

    monkeypatch.setattr(runner, "_popen", slow_popen)
    task = asyncio.ensure_future(
        runner.run(make_run(AgentKind.command, f"python {AGENTS}/hanging_agent.py", 30))
    )
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(spawned) == 1 and spawned[0].returncode is not None  # killed and reaped
    await runner.aclose()
