"""The docker compose stack and the Kubernetes manifests validate (no engine, no cluster: validated, not run)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.integration.ops.deploy_tools import (
    COMPOSE_FILE,
    K8S_DIR,
    K8S_VERSION,
    REPO,
    compose_config,
    k8s_documents,
    k8s_files,
    kubeconform,
    kubeconform_schema_dir,
)

pytestmark = pytest.mark.timeout(60)

TOKEN = {"FLYWHEEL_ADMIN_TOKEN": "s3cret-test-token"}
FLYWHEEL_SERVICES = {"gateway", "worker", "reward", "recorder", "trainer", "trainer-cpu"}


_CONFIGS: dict[tuple[str, ...], dict[str, Any]] = {}


def _config(*args: str) -> dict[str, Any]:
    """``docker-compose config`` resolved with a token set (each variant run once per session)."""
    if args not in _CONFIGS:
        result = compose_config(*args, env=TOKEN)
        assert result.returncode == 0, result.stderr
        loaded = yaml.safe_load(result.stdout)
        assert isinstance(loaded, dict)
        _CONFIGS[args] = loaded
    return _CONFIGS[args]


def _cli_commands() -> set[str]:
    """Top-level commands (and groups) of the `flywheel` CLI, as a user would see them in --help: each
    one named in the CLI's table and registered by the module the table names."""
    from flywheel.cli.main import COMMANDS, load_command

    return {name for name in COMMANDS if load_command(name).name == name}


def _named_volume_target(mount: object) -> str | None:
    """Where a named volume is mounted (long syntax, or docker-compose v1's ``name:/path:rw``)."""
    if isinstance(mount, dict):
        return mount["target"] if mount.get("type") == "volume" else None
    source, target, *_ = str(mount).split(":")
    return target if not source.startswith(("/", ".")) else None


# --------------------------------------------------------------------------------------- compose


def test_compose_requires_the_admin_token() -> None:
    result = compose_config()
    assert result.returncode != 0
    assert "FLYWHEEL_ADMIN_TOKEN" in result.stderr


def test_compose_services_are_one_flywheel_command_each_with_healthchecks() -> None:
    services = _config("--profile", "gpu", "--profile", "cpu")["services"]
    assert set(services) >= FLYWHEEL_SERVICES
    for name in FLYWHEEL_SERVICES:
        svc = services[name]
        assert svc["healthcheck"]["test"], name
        env = svc["environment"]
        assert env["FLYWHEEL_ADMIN_TOKEN"] == TOKEN["FLYWHEEL_ADMIN_TOKEN"], name
        assert env["FLYWHEEL_ENV"] == "production"
        assert env["FLYWHEEL_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"
    trainers = {"trainer", "trainer-cpu"}
    assert all(services[n]["command"] == ["trainer", "run"] for n in trainers)
    assert {services[n]["command"][0] for n in FLYWHEEL_SERVICES - trainers} == FLYWHEEL_SERVICES - trainers


def test_compose_commands_exist_in_the_cli() -> None:
    services = _config("--profile", "gpu", "--profile", "cpu")["services"]
    commands = _cli_commands()
    used: set[str] = set()
    for svc in services.values():
        if svc.get("image", "").startswith(("apache/", "clickhouse/", "vllm/")):
            continue
        used.add(svc["command"][0])
        test = svc.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", "flywheel"]:
            used.add(test[2])
    missing = used - commands
    assert not missing, f"compose uses flywheel commands that do not exist: {sorted(missing)}"


def test_compose_infrastructure_keeps_its_data() -> None:
    config = _config("--profile", "gpu", "--profile", "cpu")
    services = config["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    for name, target in [
        ("kafka", "/var/lib/kafka/data"),
        ("clickhouse", "/var/lib/clickhouse"),
        ("gateway", "/data"),
        ("trainer", "/checkpoints"),
    ]:
        mounts = services[name]["volumes"]
        assert any(_named_volume_target(m) == target for m in mounts), (name, mounts)
    assert {"kafka-data", "clickhouse-data", "gateway-spool", "checkpoints"} <= set(config["volumes"])


def test_compose_inference_profiles() -> None:
    services = _config("--profile", "gpu", "--profile", "cpu")["services"]
    vllm, engine = services["vllm"], services["engine"]
    assert vllm["profiles"] == ["gpu"] and engine["profiles"] == ["cpu"]
    command = vllm["command"]
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert command[command.index("--generation-config") + 1] == "vllm"  # absent temperature = 1.0
    assert vllm["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert engine["command"][0] == "engine"
    # Either profile answers as `inference`, which is where the gateway points.
    for svc in (vllm, engine):
        assert "inference" in svc["networks"]["default"]["aliases"]
    assert services["gateway"]["environment"]["FLYWHEEL_UPSTREAM_URLS"] == "http://inference:8000/v1"


def test_compose_gpu_profile_serves_as_flywheel_vllm_serve_does() -> None:
    """The gpu profile's vLLM is the pinned version (the one infra/scripts/vllm_env.sh installs) started
    with every flag and environment variable `flywheel vllm serve` starts vLLM with on a GPU (dev mode,
    processed logprobs, neutral sampling defaults, hermes tool calls, offline), but for the address it
    listens on and its context length (a compose setting, VLLM_MAX_MODEL_LEN)."""
    from infra.engine.vllm_server import VllmLaunch

    vllm = _config("--profile", "gpu")["services"]["vllm"]
    pinned = re.search(r"VLLM_VERSION:-([0-9.]+)", (REPO / "infra/scripts/vllm_env.sh").read_text())
    assert (
        pinned is not None and vllm["image"] == f"vllm/vllm-openai:v{pinned[1]}" == "vllm/vllm-openai:v0.33.0"
    )
    launch = VllmLaunch(model=Path("/models/policy"), device="gpu", python=Path("/env/bin/python"))
    ours, command = launch.command()[5:], vllm["command"]  # after `python -m ... serve --model DIR`
    assert vllm["entrypoint"] == ["vllm", "serve"] and command[0] == "/models/policy"
    for i, arg in enumerate(ours):
        if arg.startswith("--") and arg not in ("--host", "--dtype", "--max-model-len"):
            assert arg in command, arg
            value = ours[i + 1] if i + 1 < len(ours) and not ours[i + 1].startswith("--") else None
            assert value is None or command[command.index(arg) + 1] == value, arg
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    assert command[command.index("--max-model-len") + 1] == "8192"
    wanted = launch.environment({})
    for name in set(wanted) - {"TMPDIR", "VLLM_CACHE_ROOT"}:  # the launcher's scratch directories
        assert vllm["environment"][name] == wanted[name], name


def test_compose_gpu_profile_trains_on_cuda_and_the_cpu_profile_on_the_cpu() -> None:
    services = _config("--profile", "gpu", "--profile", "cpu")["services"]
    gpu, cpu = services["trainer"], services["trainer-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    assert gpu["environment"]["FLYWHEEL_TRAINER_DEVICE"] == "cuda"
    assert gpu["environment"]["FLYWHEEL_TRAINER_ENGINE_KIND"] == "vllm"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert cpu["environment"]["FLYWHEEL_TRAINER_DEVICE"] == "cpu"
    assert cpu["environment"]["FLYWHEEL_TRAINER_ENGINE_KIND"] == "flywheel"
    assert "deploy" not in cpu
    shared = ("image", "command", "volumes", "healthcheck")
    assert {k: gpu[k] for k in shared} == {k: cpu[k] for k in shared}
    for name in ("FLYWHEEL_TRAINER_BASE_MODEL", "FLYWHEEL_TRAINER_DIR", "FLYWHEEL_TRAINER_ENGINE_URL"):
        assert gpu["environment"][name] == cpu["environment"][name], name


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator can fail: an unknown key in a service is an error."""
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["gateway"]["not_a_compose_key"] = 1
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    import subprocess

    from tests.integration.ops.deploy_tools import require_tool

    result = subprocess.run(
        [require_tool("docker-compose"), "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        env={"FLYWHEEL_ADMIN_TOKEN": "x", "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "not_a_compose_key" in result.stderr


def test_dockerfile_copies_what_exists() -> None:
    text = (REPO / "infra" / "docker" / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.M))
    assert {"service", "train"} <= targets
    for line in re.findall(r"^COPY (.+)$", text, flags=re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (REPO / src).exists(), src
    assert 'ENTRYPOINT ["flywheel"]' in text
    compose_targets = {
        svc["build"]["target"]
        for svc in yaml.safe_load(COMPOSE_FILE.read_text())["services"].values()
        if isinstance(svc, dict) and "build" in svc
    }
    assert compose_targets <= targets


# ------------------------------------------------------------------------------------ kubernetes


def test_k8s_manifests_validate_with_kubernetes_schemas() -> None:
    docs = k8s_documents()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"Deployment", "StatefulSet", "HorizontalPodAutoscaler", "Secret", "Job", "Role"} <= kinds
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {exc.message}")


def test_k8s_inference_is_the_pinned_vllm_with_tool_calls() -> None:
    """The Kubernetes vLLM is the image compose's gpu profile pins, parsing tool calls as compose does."""
    deployment = next(
        doc for path, doc in k8s_documents() if path.name == "inference.yaml" and doc["kind"] == "Deployment"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    compose_vllm = _config("--profile", "gpu")["services"]["vllm"]
    assert container["image"] == compose_vllm["image"] == "vllm/vllm-openai:v0.33.0"
    assert "--enable-auto-tool-choice" in container["args"]
    assert "--tool-call-parser=hermes" in container["args"]


def test_k8s_manifests_pass_kubeconform(tmp_path: Path) -> None:
    schemas = kubeconform_schema_dir(tmp_path)
    result = kubeconform(k8s_files(), schemas)
    summary = json.loads(result.stdout)
    bad = [r for r in summary["resources"] if r["status"] not in ("statusValid",)]
    assert result.returncode == 0 and not bad, bad or result.stderr
    assert summary["summary"]["valid"] == len(k8s_documents())


def test_kubeconform_catches_a_bad_manifest(tmp_path: Path) -> None:
    bad = yaml.safe_load((K8S_DIR / "reward.yaml").read_text())
    bad["spec"]["template"]["spec"]["containers"][0]["bogus_field"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = kubeconform([path], kubeconform_schema_dir(tmp_path / "schemas"))
    assert result.returncode != 0
    assert "bogus_field" in result.stdout


def test_k8s_services_run_flywheel_commands() -> None:
    commands = _cli_commands()
    found: dict[str, list[str]] = {}
    for _, doc in k8s_documents():
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if container["image"].startswith("flywheel"):
                found[doc["metadata"]["name"]] = container["args"]
                assert container["args"][0] in commands, container["args"]
                names = {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
                assert "flywheel-secrets" in names
    assert found["trainer"] == ["trainer", "run"]
    assert {"gateway", "worker", "reward", "recorder"} <= set(found)


def test_k8s_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    generated = kustomization["configMapGenerator"][0]["files"][0].split("=", 1)[1]
    assert (K8S_DIR / generated).exists()


def test_rollout_job_template_renders_for_the_worker() -> None:
    """The worker's Kubernetes mode accepts the template, and the Job it renders is still valid."""
    from rollout_worker.kubernetes_runner import load_template, render_job

    template = load_template(str(K8S_DIR / "jobs" / "rollout-job.yaml"))
    episode = "0123456789abcdef0123456789abcdef"
    run = SimpleNamespace(
        episode_id=episode,
        deadline_s=120.0,
        task={"input": {}},
        llm=SimpleNamespace(base_url=f"http://gateway:8100/episodes/{episode}/v1", api_key=episode),
        env=lambda: {"OPENAI_BASE_URL": f"http://gateway:8100/episodes/{episode}/v1", "FLYWHEEL_TASK": "{}"},
    )
    job = render_job(template, run, ttl_after_finished_s=600)  # type: ignore[arg-type]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"OPENAI_BASE_URL", "FLYWHEEL_TASK", "AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"} <= env


def test_flywheels_vllm_samples_at_vllms_neutral_defaults() -> None:
    """Not the model's generation_config.json: a call without a temperature samples at 1.0, as recorded."""
    from infra.engine.vllm_server import Device, VllmLaunch

    devices: tuple[Device, ...] = ("cpu", "gpu")
    for device in devices:
        command = VllmLaunch(model=Path("/models/policy"), device=device).command()
        assert command[command.index("--generation-config") + 1] == "vllm"
