"""``flywheel ui`` as a user runs it: on a chdb directory, signed in with the admin token; refused in one
line when the directory is missing or held by another process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infra.eventlog.store import ChdbStore
from tests.integration.ops.synthetic import synthetic_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "ui-cli-admin-token-0123456789"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return {**env, "FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_DATA_DIR": str(data)}


def test_flywheel_ui_serves_a_recorded_log(tmp_path: Path) -> None:
    store = ChdbStore(tmp_path / "chdb")
    store.migrate()
    run = synthetic_run(groups=1, size=2)
    store.insert(run.events)
    store.close()
    port = _port()
    proc = subprocess.Popen(
        [FLYWHEEL, "ui", "--port", str(port)],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/ui/login", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "flywheel ui did not answer"
            time.sleep(0.2)  # another process's port: nothing to wait on but polling
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{url}/ui/", timeout=10).status_code == 401
        page = httpx.get(f"{url}/ui/", headers=auth, timeout=10)
        assert page.status_code == 200
        assert all(e.episode_id in page.text for e in run.scored)
        bad = httpx.get(f"{url}/ui/?page=-1", headers=auth, timeout=10)
        assert bad.status_code == 400 and "page must be between 1" in bad.text
        assert httpx.get(url, timeout=10).headers.get("location") == "/ui/"
        # while it holds the directory, a second one says where the first is, in one line
        second = subprocess.run(
            [FLYWHEEL, "ui", "--port", str(_port())],
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and "is held by process" in second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_flywheel_ui_without_a_log_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [FLYWHEEL, "ui", "--port", str(_port())],
        env=_env(tmp_path / "empty"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "no event log at" in done.stderr and done.stderr.count("\n") == 1, (
        done.stderr
    )
