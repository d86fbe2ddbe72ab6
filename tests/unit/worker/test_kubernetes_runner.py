"""Kubernetes Jobs against a fake API (no cluster here; untested against a live one)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout_worker.kubernetes_runner import LABEL, KubernetesRunner, RateLimiter, load_template, render_job
from rollout_worker.llm import LLM
from rollout_worker.runners import AgentRun, AgentSpecError
from schemas import AgentKind, AgentRef, EpisodeStatus

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  generateName: my-agent-
  labels: {team: rl}
spec:
  template:
    spec:
      containers:
        - name: agent
          image: my-agent:1
          env:
            - {name: KEEP, value: "1"}
            - {name: OPENAI_API_KEY, value: "placeholder"}
        - name: sidecar
          image: proxy:1
"""


class FakeBatch:
    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = statuses
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert namespace == "agents"
        self.created.append(body)
        return body

    def read_namespaced_job_status(self, name: str, namespace: str) -> dict[str, Any]:
        return {"status": self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]}

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str = "") -> None:
        self.deleted.append(name)


class FakeCore:
    def __init__(self, log: str) -> None:
        self.log = log
        self.selectors: list[str] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> dict[str, Any]:
        self.selectors.append(label_selector)
        return {"items": [{"metadata": {"name": "pod-1"}}]}

    def read_namespaced_pod_log(self, name: str, namespace: str, tail_lines: int = 0) -> str:
        return self.log


@pytest.fixture
def template_path(tmp_path: Path) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(TEMPLATE)
    return str(path)


def make_run(spec: str, deadline_s: float = 30.0) -> AgentRun:
    ep = "cd" * 16
    return AgentRun(
        episode_id=ep,
        agent=AgentRef(kind=AgentKind.kubernetes, spec=spec),
        task={"task_id": "t", "input": 1},
        llm=LLM(f"http://gw/episodes/{ep}/v1", ep, "policy"),
        deadline_s=deadline_s,
        deadline_at=datetime.now(UTC) + timedelta(seconds=deadline_s),
    )


def test_render_injects_env_deadline_ttl_and_labels(template_path: str) -> None:
    run = make_run(template_path, deadline_s=12.2)
    job = render_job(load_template(template_path), run, ttl_after_finished_s=99)
    assert job["metadata"]["name"] == f"flywheel-{'cd' * 10}" and "generateName" not in job["metadata"]
    assert job["metadata"]["labels"] == {
        "team": "rl",
        LABEL: run.episode_id,
        "app.kubernetes.io/managed-by": "flywheel",
        "agentlightning/rollout-id": run.episode_id,
        "agentlightning/attempt-id": "0",
    }
    assert job["spec"]["activeDeadlineSeconds"] == 13
    assert job["spec"]["ttlSecondsAfterFinished"] == 99 and job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"][LABEL] == run.episode_id and pod["spec"]["restartPolicy"] == "Never"
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == run.llm.base_url
        assert env["OPENAI_API_KEY"] == run.episode_id and '"task_id": "t"' in env["FLYWHEEL_TASK"]
        assert env["AGL_OPENAI_BASE_URL"] == run.llm.base_url and env["AGL_KEY"] == run.episode_id
        assert env["AGL_EVENT_URL"] == f"http://gw/episodes/{run.episode_id}/agl/events"
    assert {"name": "KEEP", "value": "1"} in pod["spec"]["containers"][0]["env"]


AGL_TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata: {name: auto}
spec:
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: agent
          image: calc:1
          args: [{{ job_name | yaml_escape }}]
          env:
            - {name: QUESTION, value: {{ input.question | yaml_escape }}}
            - {name: AGL_KEY, value: "from-the-template"}
"""


def test_agl_jinja_template_renders_from_the_task_input(tmp_path: Path) -> None:
    path = tmp_path / "job-template.yaml"
    path.write_text(AGL_TEMPLATE)
    question = 'two: "quoted" words\nand a line'
    run = dataclasses.replace(make_run(str(path)), task={"input": {"question": question}})
    job = render_job(load_template(str(path)), run, ttl_after_finished_s=5)
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["QUESTION"] == question  # yaml_escape: JSON-quoted, so YAML reads the string back exactly
    assert env["AGL_KEY"] == run.episode_id  # AGL's variables replace the template's entries of that name
    assert container["args"] == [job["metadata"]["name"]]  # job_name is the Job's real name
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # forced, as AGL forces it


@pytest.mark.timeout(10)
async def test_a_task_input_the_template_cannot_render_fails_the_episode_clearly(tmp_path: Path) -> None:
    path = tmp_path / "job-template.yaml"
    path.write_text(AGL_TEMPLATE.replace("input.question", "input.q.deeper"))
    runner = KubernetesRunner(namespace="agents", batch_api=FakeBatch([{}]), core_api=FakeCore(""))
    with pytest.raises(AgentSpecError, match="the task's input lacks"):
        await runner.run(make_run(str(path)))  # the rollout runner turns this into an error episode


def test_the_template_sandbox_keeps_python_internals_out(tmp_path: Path) -> None:
    path = tmp_path / "job-template.yaml"
    path.write_text(AGL_TEMPLATE.replace("input.question", "input.__class__.__subclasses__()"))
    with pytest.raises(AgentSpecError, match="rendering the Job template failed"):
        render_job(load_template(str(path)), make_run(str(path)), ttl_after_finished_s=5)


def test_bad_templates(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    for text in ["kind: Pod\n", "kind: Job\nspec: {}\n", "{{{", "kind: Job\n---\nkind: Job\n", "{% if %}"]:
        bad.write_text(text)
        with pytest.raises(AgentSpecError):
            load_template(str(bad))
    with pytest.raises(AgentSpecError):
        load_template(str(tmp_path / "missing.yaml"))


@pytest.mark.timeout(10)
async def test_job_succeeds_and_log_result_is_read(template_path: str) -> None:
    batch = FakeBatch([{"active": 1}, {"active": 1}, {"succeeded": 1}])
    core = FakeCore('working\n{"reward": 1.0, "output": "done"}\n')
    runner = KubernetesRunner(namespace="agents", poll_s=0.01, batch_api=batch, core_api=core)
    result = await runner.run(make_run(template_path))
    assert result.status is EpisodeStatus.ok and result.reward == 1.0 and result.output == "done"
    assert len(batch.created) == 1 and not batch.deleted
    assert core.selectors == [f"{LABEL}={'cd' * 16}"]


@pytest.mark.timeout(10)
async def test_job_failure_and_deadline_exceeded(template_path: str) -> None:
    failed = FakeBatch(
        [
            {
                "failed": 1,
                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
            }
        ]
    )
    runner = KubernetesRunner(namespace="agents", poll_s=0.01, batch_api=failed, core_api=FakeCore("boom"))
    result = await runner.run(make_run(template_path))
    assert result.status is EpisodeStatus.error and "boom" in (result.error or "")
    dead = FakeBatch([{"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}])
    runner = KubernetesRunner(namespace="agents", poll_s=0.01, batch_api=dead, core_api=FakeCore(""))
    assert (await runner.run(make_run(template_path))).status is EpisodeStatus.timeout


@pytest.mark.timeout(10)
async def test_our_deadline_deletes_the_job(template_path: str) -> None:
    batch = FakeBatch([{"active": 1}])
    runner = KubernetesRunner(namespace="agents", poll_s=0.01, batch_api=batch, core_api=FakeCore(""))
    result = await runner.run(make_run(template_path, deadline_s=0.1))
    assert result.status is EpisodeStatus.timeout
    assert batch.deleted == [f"flywheel-{'cd' * 10}"]


@pytest.mark.timeout(5)
async def test_jobs_per_minute_limit() -> None:
    now = [0.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    await limiter.acquire()
    await limiter.acquire()
    assert len(limiter.stamps) == 2
    now[0] = 60.0  # the window slid: a third Job may start without waiting
    await limiter.acquire()
    assert list(limiter.stamps) == [60.0]
