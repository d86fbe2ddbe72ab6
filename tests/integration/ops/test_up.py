"""`flywheel up` as a user runs it: one process, other commands reach it via --url, Ctrl-C stops it cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "up-test-admin-token-0123456789abcdef"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLYWHEEL, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_up_serves_records_and_stops_cleanly(tmp_path: Path) -> None:
    port = _port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_TRAINER_TORCH_THREADS": "1"})
    log = (tmp_path / "up.log").open("w+")
    proc = subprocess.Popen(
        [FLYWHEEL, "up", "--tiny", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with httpx.Client(timeout=5) as client:
            for _ in range(900):  # the first start builds the toy model and imports torch: slow on 2 cores
                if proc.poll() is not None:
                    pytest.fail(
                        f"flywheel up exited with {proc.returncode}: {Path(log.name).read_text()[-2000:]}"
                    )
                try:
                    if client.get(f"{url}/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                proc_wait(proc, 0.2)
            else:
                pytest.fail("flywheel up did not become ready")

        status = _cli(env, "status", "--url", url, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["runtime"] == "embedded"
        assert {n for n, s in report["services"].items() if s["up"]} >= {
            "gateway",
            "engine",
            "worker",
            "reward",
            "recorder",
            "trainer",
        }

        # One training episode through the gateway, as an agent would make it.
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=60, headers=headers) as client:
            opened = client.post(f"{url}/admin/episodes", json={}).json()
            answer = client.post(
                f"{opened['base_url']}/chat/completions",
                json={
                    "model": "policy",
                    "messages": [{"role": "user", "content": "What is 1 plus 2?"}],
                    "max_tokens": 6,
                },
            )
            assert answer.status_code == 200, answer.text
            assert (
                client.post(
                    f"{url}/admin/episodes/{opened['episode_id']}/finish", json={"reward": 1.0}
                ).status_code
                == 200
            )

        # The trainer's one pause channel: the control topic, reached through the stack's admin API.
        trainer_dir = str(tmp_path / "data" / "trainer")
        for args, paused in ((("pause", "--reason", "maintenance"), True), (("resume",), False)):
            asked = _cli(env, "trainer", *args, "--url", url)
            assert asked.returncode == 0, asked.stdout + asked.stderr
            for _ in range(100):
                shown = _cli(env, "trainer", "status", "--json", "--dir", trainer_dir)
                if shown.returncode == 0 and json.loads(shown.stdout)["paused"] is paused:
                    break
                proc_wait(proc, 0.1)
            else:
                pytest.fail(f"the trainer did not report paused={paused}: {shown.stdout} {shown.stderr}")

        wrong = _cli({**env, "FLYWHEEL_ADMIN_TOKEN": "wrong-token-wrong-token"}, "status", "--url", url)
        assert wrong.returncode == 1 and "401" in wrong.stderr
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("flywheel up did not stop on Ctrl-C")
        log.close()
    output = (tmp_path / "up.log").read_text()
    assert code == 0, output[-2000:]
    assert "stopped cleanly" in output and "Traceback" not in output
    # Nothing lost: the directory is free again and holds the episode's events.
    query = _cli(
        {**env, "FLYWHEEL_DATA_DIR": str(tmp_path / "data")},
        "query",
        "--json",
        "SELECT type FROM flywheel.events GROUP BY type",
    )
    assert query.returncode == 0, query.stderr
    assert {"episode_started", "llm_call_recorded", "episode_finished"} <= set(
        query.stdout.replace('"', " ").split()
    )


def proc_wait(proc: subprocess.Popen[str], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(seconds)


def test_up_refuses_vllm_flags_that_do_not_fit_in_one_line(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    for args, words in (
        (["--tiny", "--vllm", "http://127.0.0.1:1"], "need --model"),
        (["--model", str(model), "--vllm", "http://127.0.0.1:1", "--engine", "vllm"], "give one of them"),
        (["--model", str(model), "--engine", "sglang"], "embedded or vllm"),
    ):
        done = subprocess.run([FLYWHEEL, "up", *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
