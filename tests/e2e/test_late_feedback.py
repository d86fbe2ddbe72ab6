"""Feedback that arrives after the trainer moved on trains, with the off-policy correction (issue 50).

``flywheel up --tiny`` runs the whole embedded stack. Four production sessions are served at weight
version 0 and ended unrated (users who rate later: the reward service scores them without a reward and
the trainer leaves them waiting). Twenty more sessions, rated at once, train the policy ten versions on.
Then the four early users rate: the reward service re-scores their sessions and the trainer trains them
ten versions late, under the default ``stale_policy = "weight"``: the step's production samples include
them, its lag is ≥ 10, and the correction's figures (the truncated importance weights against the
recorded behaviour logprobs, M2PO's second moment) are reported. Under the old rule
(``stale_policy = "drop"``) the same late sessions train nothing, and the status JSON says why
(``excluded.stale_transition``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_production_training import FLYWHEEL, _cli, _port, _trainer_status, _wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

TOKEN = "late-e2e-admin-token-0123456789abcdef"
LATE = 4  # sessions rated after the trainer moved on
STEPS_BETWEEN = 10  # trainer steps (versions) between their calls and their ratings


def _session(client: Any, http: httpx.Client, session: str, problem: str, rating: int | None) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="policy",
        messages=[{"role": "user", "content": problem}],
        max_tokens=8,
        extra_headers={"X-Flywheel-Session": session},
    )
    assert raw.parse().choices[0].message is not None
    if rating is not None:
        fb = http.post("/v1/feedback", json={"session_id": session, "rating": rating})
        assert fb.status_code == 200, fb.text
    end = http.post(f"/v1/sessions/{session}/end")
    assert end.status_code == 200, end.text


def _wait_step(
    env: dict[str, str], trainer_dir: Path, step: int, proc: subprocess.Popen[str], log: Path
) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = _trainer_status(env, trainer_dir)
        if status is not None and status.get("step", 0) >= step:
            return status
        if proc.poll() is not None:
            pytest.fail(f"flywheel up exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    pytest.fail(f"no trainer step {step} within 120 s: {status}; {log.read_text()[-2000:]}")


def _wait_status(
    env: dict[str, str], trainer_dir: Path, what: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The trainer's status once ``done`` holds of it (60 s at most; ``what`` names the wait)."""
    deadline = time.monotonic() + 60
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = _trainer_status(env, trainer_dir)
        if status is not None and done(status):
            return status
        time.sleep(0.5)
    pytest.fail(f"{what} within 60 s: {status}")


@pytest.mark.parametrize("policy", ["weight", "drop"])
def test_feedback_ten_versions_late_trains_with_the_correction(tmp_path: Path, policy: str) -> None:
    from openai import OpenAI

    port = _port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(
        {
            "FLYWHEEL_ADMIN_TOKEN": TOKEN,
            "FLYWHEEL_DATA_DIR": str(data),
            "FLYWHEEL_TRAINER_TORCH_THREADS": "1",
            "FLYWHEEL_TRAINER_BATCH_GROUPS": "2",  # a step per two rated sessions
            "FLYWHEEL_TRAINER_ALGO__LEARNING_RATE": "1e-3",
            "FLYWHEEL_TRAINER_ALGO__STALE_POLICY": policy,
        }
    )
    log_path = tmp_path / "up.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [FLYWHEEL, "up", "--tiny", "--port", str(port), "--data-dir", str(data)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    trainer_dir = data / "trainer"
    try:
        _wait_ready(proc, url, log_path)
        created = _cli(env, "keys", "create", "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        with (
            OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60) as client,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        ):
            for i in range(LATE):  # served at version 0, rated only at the end
                _session(client, http, f"late-{i}", f"What is {i} plus 2?", None)
            for step in range(1, STEPS_BETWEEN + 1):  # one liked, one disliked session per step
                _session(client, http, f"now-{step}-a", f"What is {step} plus 1?", 1)
                _session(client, http, f"now-{step}-b", f"What is {step} plus 3?", -1)
                _wait_step(env, trainer_dir, step, proc, log_path)
            before = _trainer_status(env, trainer_dir)
            assert before is not None and before["version"] >= STEPS_BETWEEN, before
            assert before["samples"]["production"] > 0
            for i in range(LATE):
                fb = http.post("/v1/feedback", json={"session_id": f"late-{i}", "rating": 1 if i % 2 else -1})
                assert fb.status_code == 200, fb.text
            if policy == "drop":
                status = _wait_status(
                    env,
                    trainer_dir,
                    "no excluded.stale_transition",
                    lambda st: st.get("excluded", {}).get("stale_transition", 0) > 0,
                )
                assert status["samples"]["production"] == before["samples"]["production"], status
                assert status["step"] == before["step"], "a batch of only stale sessions trained nothing"
                return
            target = before["samples"]["production"] + LATE
            status = _wait_status(
                env,
                trainer_dir,
                "the late sessions did not train",
                lambda st: st["samples"]["production"] >= target,
            )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    # the late sessions trained: every one of their transitions, ten or more versions behind
    trained = status["samples"]["production"] - before["samples"]["production"]
    assert trained >= LATE, (before["samples"], status["samples"])
    metrics = status["metrics"]
    assert metrics["staleness_max"] >= STEPS_BETWEEN, metrics
    assert metrics["samples_production"] > 0
    assert not any(k.startswith("stale") for k in status.get("excluded", {})), status["excluded"]
    # and corrected: the importance weights against the recorded behaviour logprobs moved off 1, and
    # the policy's drift from the behaviour policy is measured (M2PO's second moment)
    assert metrics["m2"] > 0, metrics
    assert metrics["behaviour_kl"] > 0, metrics
    assert metrics["tis_mean"] != 1.0, metrics
    assert metrics["grad_norm"] > 0, metrics
