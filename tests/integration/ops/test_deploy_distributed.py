"""The distributed-training deploy files validate: compose's verl overlay, the torchrun Job option."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.ops.deploy_tools import REPO, compose_config, k8s_documents

pytestmark = pytest.mark.timeout(60)
TOKEN = {"FLYWHEEL_ADMIN_TOKEN": "s3cret-test-token"}
VERL_OVERLAY = REPO / "infra" / "docker-compose.verl.yml"


def _config(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = compose_config(*args, env={**TOKEN, **(env or {})})
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = yaml.safe_load(result.stdout)
    return loaded


def test_compose_trainer_selects_backend_and_ranks_and_the_gateway_asks_for_versions() -> None:
    services = _config("--profile", "gpu", env={"FLYWHEEL_TRAINER_DP": "2"})["services"]
    env = services["trainer"]["environment"]
    assert env["FLYWHEEL_TRAINER_BACKEND"] == "torch" and env["FLYWHEEL_TRAINER_DP"] == "2"
    assert services["gateway"]["environment"]["FLYWHEEL_REQUEST_WEIGHT_VERSIONS"] == "true"


def test_compose_verl_overlay_runs_the_trainer_on_verl_with_a_gpu() -> None:
    services = _config("-f", str(VERL_OVERLAY), "--profile", "gpu")["services"]
    trainer = services["trainer"]
    assert trainer["command"] == ["trainer", "run"]
    assert trainer["build"]["target"] == "verl"
    assert trainer["environment"]["FLYWHEEL_TRAINER_BACKEND"] == "verl"
    assert trainer["environment"]["FLYWHEEL_TRAINER_ENGINE_KIND"] == "vllm"
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # the shared checkpoints the vLLM service reloads from are still mounted
    assert any("/checkpoints" in str(m) for m in trainer["volumes"])
    vllm = services["vllm"]
    assert vllm["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "processed_logprobs" in vllm["command"]
    dockerfile = (REPO / "infra" / "docker" / "Dockerfile").read_text()
    assert "FROM base AS verl" in dockerfile and "--extra verl" in dockerfile


def test_k8s_torchrun_job_is_indexed_and_runs_the_trainer_under_torchrun() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for p, d in k8s_documents() if p.parent.name == "options"}
    job = docs[("Job", "trainer-torchrun")]
    service = docs[("Service", "trainer-torchrun")]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    container = pod["containers"][0]
    command = container["command"]
    assert command[0] == "torchrun" and f"--nnodes={spec['completions']}" in command
    assert "--master-addr=trainer-torchrun-0.trainer-torchrun" in command
    assert command[-2:] == ["-m", "flywheel.cli.main"] and container["args"] == ["trainer", "run"]
    env = {e["name"]: e for e in container["env"]}
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert "flywheel-checkpoints" in claims
