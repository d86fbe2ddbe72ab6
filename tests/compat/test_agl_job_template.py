"""Flywheel's worker renders Agent Lightning Job templates as AGL 1.0.2's own controller renders them.

For each Job template AGL ships in its sdist's examples (calc_x, swe_smith, llm-in-sandbox), the same
rollout input is rendered twice: by AGL's ``build_job_spec`` (``agentlightning/controller/
k8s_reconciler.py``, run in AGL's 3.12 venv) and by ``rollout_worker.kubernetes_runner.render_job``.
The manifests must be equal once the differences Flywheel makes by design are set aside, and only
those: the Job's name (``flywheel-…`` for AGL's ``agl-rollout-…``, wherever the template used
``job_name``), the namespace (Flywheel passes it to the API call), the managed-by label's value and
Flywheel's ``flywheel.dev/episode`` label, the values of ``AGL_OPENAI_BASE_URL``/``AGL_EVENT_URL``/
``AGL_KEY`` (they point at Flywheel's gateway) and Flywheel's own episode variables beside them.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import JsonValue

from rollout_worker.kubernetes_runner import LABEL, job_name, load_template, render_job
from rollout_worker.llm import LLM
from rollout_worker.runners import AgentRun
from schemas import AgentKind, AgentRef
from tests.compat.agl_env import agl_python, agl_sdist, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EPISODE = "0f" * 16
AGL_VARS = ("AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY")
FLYWHEEL_VARS = {"OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "FLYWHEEL_MODEL", "FLYWHEEL_TASK"}
FLYWHEEL_VARS |= {"FLYWHEEL_EPISODE_ID"}
FLYWHEEL_VARS |= {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"}  # agents on the Messages API find the gateway

AGL_RENDER = """
import json, sys
from omegaconf import OmegaConf
from agentlightning.controller.k8s_reconciler import build_job_spec
from agentlightning.schemas import Rollout, RolloutConfig, RolloutK8sConfig, RolloutLifecycleStatus
spec = json.load(sys.stdin)
rollout = Rollout(
    rollout_id=spec["rollout_id"],
    input=spec["input"],
    config=RolloutConfig(timeout_seconds=spec["timeout"], k8s=RolloutK8sConfig(job_template=spec["template"])),
    status=RolloutLifecycleStatus(created_at=1.0, updated_at=1.0),
)
config = OmegaConf.create({
    "agl_server": {"url": "http://agl-server:8080", "key": "secret"},
    "k8s_runner": {"namespace": "agents", "ttl_after_finished": spec["ttl"]},
})
print(json.dumps(build_job_spec(rollout, config)))
"""

CASES: dict[str, JsonValue] = {
    "calc_x/job-template.yaml": {"question": 'What is "12" times 7?\nShow: work', "result": "84"},
    "swe_smith/job-template-openai.yaml": {
        "image_name": "swebench/sweb.eval.x86_64.django__django-1",
        "problem_statement": "QuerySet.update() ignores: `F()` {expressions}\n  # indented",
        "instance_id": "django__django-1",
    },
    "llm-in-sandbox/job-template.yaml": {
        "extra_info": {"data_folder_name": "math", "data_filename": "test.jsonl", "data_index": 3}
    },
}


def agl_manifest(template: str, task_input: Any, *, timeout: int, ttl: int) -> dict[str, Any]:
    spec = {"rollout_id": EPISODE, "input": task_input, "template": template, "timeout": timeout, "ttl": ttl}
    done = subprocess.run(
        [str(agl_python()), "-c", AGL_RENDER],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    manifest: dict[str, Any] = json.loads(done.stdout)
    return manifest


def prune(value: Any) -> Any:
    """Drop empty mappings (``setdefault`` leaves them where a template had none)."""
    if isinstance(value, dict):
        pruned = {k: prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {}}
    if isinstance(value, list):
        return [prune(v) for v in value]
    return value


def comparable(manifest: dict[str, Any], *, ours: bool) -> dict[str, Any]:
    text = json.dumps(manifest)
    if ours:  # the template's job_name was Flywheel's Job name; AGL's is agl-rollout-<rollout id>
        text = text.replace(job_name(EPISODE), f"agl-rollout-{EPISODE}")
    job = json.loads(text)
    meta = job["metadata"]
    if not ours:
        assert meta.pop("namespace") == "agents"
    labels = meta["labels"]
    assert labels.pop("app.kubernetes.io/managed-by") == ("flywheel" if ours else "agentlightning")
    if ours:
        assert labels.pop(LABEL) == EPISODE
        assert job["spec"]["template"]["metadata"]["labels"].pop(LABEL) == EPISODE
    for container in job["spec"]["template"]["spec"]["containers"]:
        env = {e["name"]: e for e in container.get("env", [])}
        for name in AGL_VARS:
            assert name in env, f"{name} missing"
            env[name] = {"name": name, "value": "<set by the runner>"}
        if ours:
            assert env.keys() >= FLYWHEEL_VARS
            env = {k: v for k, v in env.items() if k not in FLYWHEEL_VARS}
        container["env"] = sorted(env.values(), key=lambda e: e["name"])  # ours appends AGL's at the end
    pruned: dict[str, Any] = prune(job)
    return pruned


@pytest.mark.parametrize("example", sorted(CASES))
def test_an_agl_example_job_template_renders_as_agl_renders_it(example: str) -> None:
    path = agl_sdist() / "examples" / example
    task_input = CASES[example]
    run = AgentRun(
        episode_id=EPISODE,
        agent=AgentRef(kind=AgentKind.kubernetes, spec=str(path)),
        task={"task_id": "t", "input": task_input},
        llm=LLM(f"http://gateway:8100/episodes/{EPISODE}/v1", EPISODE, "policy"),
        deadline_s=600.0,
        deadline_at=datetime.now(UTC) + timedelta(seconds=600),
    )
    ours = render_job(load_template(str(path)), run, ttl_after_finished_s=60)
    theirs = agl_manifest(path.read_text(), task_input, timeout=600, ttl=60)
    assert comparable(ours, ours=True) == comparable(theirs, ours=False)
    env = {e["name"]: e["value"] for e in ours["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGL_EVENT_URL"] == f"http://gateway:8100/episodes/{EPISODE}/agl/events"
    assert env["AGL_OPENAI_BASE_URL"] == run.llm.base_url and env["AGL_KEY"] == EPISODE
