"""Production traffic trains, end to end (issue 15).

``flywheel up --tiny`` runs the whole embedded stack; a tenant key comes from ``flywheel keys create``;
production sessions go through the real ``openai`` SDK against ``/v1`` with ``X-Flywheel-Session``;
each gets thumbs up or down on ``/v1/feedback`` and is ended with ``/v1/sessions/{id}/end``. The
trainer's step must contain the production samples (``flywheel trainer status --json``), with a
non-zero gradient, and the policy it wrote must give the liked responses a higher likelihood than the
base model did (measured on the token ids the event log recorded, with the trainer's own logprob code
on the checkpoint the stack saved). On a trainer without production baselines nothing trains: a
production session is a group of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "prod-e2e-admin-token-0123456789abcdef"
PROBLEMS = ["What is 2 plus 3?", "What is 4 plus 1?", "What is 7 plus 2?", "What is 3 plus 3?"]
PROBLEMS += ["What is 1 plus 5?", "What is 6 plus 2?"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLYWHEEL, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _wait_ready(proc: subprocess.Popen[str], url: str, log: Path) -> None:
    with httpx.Client(timeout=5) as client:
        deadline = time.monotonic() + 240  # the first start builds the toy model and imports torch
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"flywheel up exited with {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
    pytest.fail("flywheel up did not become ready")


def _trainer_status(env: dict[str, str], trainer_dir: Path) -> dict[str, Any] | None:
    r = _cli(env, "trainer", "status", "--dir", str(trainer_dir), "--json")
    if r.returncode != 0:
        return None
    status: dict[str, Any] = json.loads(r.stdout)
    return status


def _recorded_ids(
    env: dict[str, str], url: str, episode_ids: list[str]
) -> dict[str, tuple[list[int], list[int]]]:
    """Per episode: the prompt and completion token ids the gateway recorded (the event log's payload)."""
    quoted = ", ".join(f"'{e}'" for e in episode_ids)
    sql = f"SELECT episode_id, payload FROM flywheel.events WHERE type = 'llm_call_recorded' AND episode_id IN ({quoted})"
    r = _cli(env, "query", "--url", url, "--json", sql)
    assert r.returncode == 0, r.stderr
    out: dict[str, tuple[list[int], list[int]]] = {}
    for episode_id, payload in json.loads(r.stdout)["rows"]:
        call = json.loads(payload)
        out[episode_id] = (call["prompt_token_ids"], call["choices"][0]["token_ids"])
    return out


def _logprobs(
    model_dir: Path, checkpoint: Path | None, pairs: list[tuple[list[int], list[int]]]
) -> list[float]:
    """Sum of completion-token logprobs under the base model or a checkpoint, by the trainer's code."""
    from trainer.app import load_backend
    from trainer.batching import sft_samples
    from trainer.config import AlgorithmConfig

    backend = load_backend(model_dir, AlgorithmConfig(), torch_threads=1)
    if checkpoint is not None:
        backend.load_checkpoint(checkpoint, 1)
    return backend.sequence_logprobs(sft_samples(pairs))


# (trainer settings, production samples the step trains on, whether the disliked responses must fall)
CASES = {
    # group-free baseline (trainer.baselines): liked up, disliked down
    "grpo": ({}, len(PROBLEMS), True),
    # the critic is the baseline; it starts at 0, so a disliked reward of 0 gives no push either way
    "ppo": ({"FLYWHEEL_TRAINER_ALGO__ALGORITHM": "ppo"}, len(PROBLEMS), False),
    # SFT on what passed the threshold: the liked sessions only
    "sft": ({"FLYWHEEL_TRAINER_OBJECTIVE": "sft"}, len(PROBLEMS) // 2, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_production_sessions_with_feedback_train_the_policy(tmp_path: Path, case: str) -> None:
    from openai import OpenAI

    extra_env, expected_samples, disliked_fall = CASES[case]
    port = _port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(
        {
            "FLYWHEEL_ADMIN_TOKEN": TOKEN,
            "FLYWHEEL_DATA_DIR": str(data),
            "FLYWHEEL_TRAINER_TORCH_THREADS": "1",
            # one step once every session is scored (each waiting production session counts as a group)
            "FLYWHEEL_TRAINER_BATCH_GROUPS": str(len(PROBLEMS)),
            "FLYWHEEL_TRAINER_CHECKPOINT_EVERY": "1",
            "FLYWHEEL_TRAINER_ALGO__LEARNING_RATE": "1e-3",
            **extra_env,
        }
    )
    log_path = tmp_path / "up.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [FLYWHEEL, "up", "--tiny", "--port", str(port), "--data-dir", str(data), "--max-steps", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_ready(proc, url, log_path)
        created = _cli(env, "keys", "create", "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        liked: list[str] = []
        disliked: list[str] = []
        with (
            OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60) as client,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        ):
            for i, problem in enumerate(PROBLEMS):
                session = f"user-{i}"
                raw = client.chat.completions.with_raw_response.create(
                    model="policy",
                    messages=[{"role": "user", "content": problem}],
                    max_tokens=8,
                    extra_headers={"X-Flywheel-Session": session},
                )
                assert raw.parse().choices[0].message is not None
                episode_id = raw.headers["X-Flywheel-Episode"]
                good = i % 2 == 0
                (liked if good else disliked).append(episode_id)
                fb = http.post("/v1/feedback", json={"session_id": session, "rating": 1 if good else -1})
                assert fb.status_code == 200, fb.text
                end = http.post(f"/v1/sessions/{session}/end")
                assert end.status_code == 200 and end.json()["episode_id"] == episode_id, end.text

        trainer_dir = data / "trainer"
        status: dict[str, Any] | None = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status = _trainer_status(env, trainer_dir)
            if status is not None and status.get("step", 0) >= 1:
                break
            if proc.poll() is not None:
                pytest.fail(f"flywheel up exited: {log_path.read_text()[-2000:]}")
            time.sleep(1.0)  # the trainer runs in another process: its status file is what we can read
        assert status is not None and status.get("step", 0) >= 1, (status, log_path.read_text()[-3000:])
        assert status["samples"]["production"] == expected_samples, status
        assert status["samples"]["live"] == 0
        assert status["metrics"]["grad_norm"] > 0
        assert status["metrics"]["samples_production"] == expected_samples
        recorded = _recorded_ids(env, url, liked + disliked)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("flywheel up did not stop on Ctrl-C")
        log.close()
    assert code == 0, log_path.read_text()[-2000:]

    from flywheel.cli.ops_up import TINY_CACHE

    checkpoint = trainer_dir / "checkpoints" / "v000001"
    assert (checkpoint / "model.safetensors").is_file()
    liked_pairs = [recorded[e] for e in liked]
    disliked_pairs = [recorded[e] for e in disliked]
    before = _logprobs(TINY_CACHE, None, liked_pairs + disliked_pairs)
    after = _logprobs(TINY_CACHE, checkpoint, liked_pairs + disliked_pairs)
    n = len(liked_pairs)
    rise = [a - b for a, b in zip(after[:n], before[:n], strict=True)]
    fall = [a - b for a, b in zip(after[n:], before[n:], strict=True)]
    print(f"{case}: liked responses' logprob change {rise}, disliked {fall}")  # the figures, with -s
    assert all(r > 0 for r in rise), (rise, fall)
    if disliked_fall:
        assert sum(fall) < 0, (rise, fall)
