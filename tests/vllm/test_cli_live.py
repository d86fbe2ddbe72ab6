"""``flywheel up --model DIR --vllm URL`` from the command line: the stack serves through the running vLLM and
records what it answered, readable back through the admin API's event log."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.faults.procs import FLYWHEEL, TOKEN, clean_env, free_port
from tests.vllm.conftest import SERVED_NAME

pytestmark = pytest.mark.timeout(600)
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def test_flywheel_up_serves_and_records_through_a_running_vllm(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        FLYWHEEL,
        "up",
        "--model",
        str(vllm_model_dir),
        "--vllm",
        warm,
        "--no-trainer",
        "--port",
        str(port),
    ]
    with (tmp_path / "up.log").open("w") as log:
        proc = subprocess.Popen(
            [*cmd, "--data-dir", str(tmp_path / "data")],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(timeout=30, headers=ADMIN) as admin:
            for _ in range(300):
                assert proc.poll() is None, (tmp_path / "up.log").read_text()[-2000:]
                try:
                    if admin.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            opened = admin.post(f"{url}/admin/episodes", json={}).json()
            with openai.OpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0) as client:
                r = client.chat.completions.create(
                    model=SERVED_NAME,
                    messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=8,
                )
            admin.post(f"{url}/admin/episodes/{opened['episode_id']}/finish", json={"reward": 1.0})
            sql = (
                "SELECT payload FROM flywheel.events FINAL WHERE type = 'llm_call_recorded' "
                f"AND episode_id = '{opened['episode_id']}'"
            )
            rows: list[list[str]] = []
            for _ in range(60):
                rows = admin.post(f"{url}/admin/eventlog/query", json={"sql": sql}).json()["rows"]
                if rows:
                    break
                time.sleep(0.5)
        [[payload]] = rows
        call = json.loads(payload)
        assert call["upstream"] == "vllm" and call["upstream_url"].startswith(warm)
        assert call["token_faithful"] and call["prompt_token_ids"]
        assert call["choices"][0]["text"] == r.choices[0].message.content
        assert len(call["choices"][0]["token_ids"]) == len(call["choices"][0]["logprobs"]) > 0
    finally:
        proc.terminate()
        proc.wait(60)
