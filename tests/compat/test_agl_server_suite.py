"""Agent Lightning 1.0.2's own server tests, over real HTTP, against ``flywheel agl-server``.

The test command fetches AGL's sdist with pip and builds a Python 3.12 venv with it (both cached under
~/.cache/flywheel, see ``agl_env.py``), copies the sdist's ``tests/`` to a temporary directory, puts
``agl_adapter_conftest.py`` in place of its ``tests/server/conftest.py`` (the fixture that built AGL's
app in-process becomes a client of the running server), and runs AGL's tests there with its venv's
pytest. AGL's assertions are run unchanged; none of its code is in this repository.

Run: every test of ``tests/server/test_endpoints.py`` and ``test_proxy_disconnect.py``'s
``test_disconnect_drains_only_abandoned_request[upstream]``. Not run, because they test AGL's own code
rather than the HTTP contract: ``[retry_backoff]`` (replaces AGL's internal retry sleep and waits for
it to be called), ``test_cancelled_handler_joins_forwarding_and_disconnect_watcher`` (calls AGL's route
function with a hand-made ``Request`` and reads ``app.state``), ``tests/controller`` (AGL's controller
against a mocked client: no server involved) and ``tests/test_client.py`` (AGL's client only).

The server runs with its defaults for the pause: a paused call is answered 429 at once, as AGL does
(``test_proxy_disconnect`` asserts the 429 while a call is in flight).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from tests.compat.agl_env import agl_python, agl_sdist, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
REPO = Path(__file__).resolve().parents[2]
ADAPTER = Path(__file__).with_name("agl_adapter_conftest.py")
SELECTED = [
    "tests/server/test_endpoints.py",
    "tests/server/test_proxy_disconnect.py::test_disconnect_drains_only_abandoned_request[upstream]",
]
EXPECTED_TESTS = 27  # what SELECTED collects from the 1.0.2 sdist (a drop means a test went missing)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keys(data_dir: Path, n: int) -> list[str]:
    from gateway.keys import KeyStore

    store = KeyStore(data_dir / "gateway" / "keys.json")
    return [store.create(f"agl-test-{i}")[1] for i in range(n)]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"flywheel agl-server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"flywheel agl-server did not answer /healthz: {log.read_text()[-2000:]}")


def test_agl_server_tests_pass_against_flywheel(tmp_path: Path) -> None:
    python = agl_python()
    sdist = agl_sdist()
    work = tmp_path / "agl"
    shutil.copytree(sdist / "tests", work / "tests")
    shutil.copy(sdist / "pyproject.toml", work / "pyproject.toml")
    shutil.copy(ADAPTER, work / "tests" / "server" / "conftest.py")

    data_dir = tmp_path / "data"
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(_keys(data_dir, 48)))
    port, stub_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(
        PYTHONPATH=str(REPO),
        FLYWHEEL_DATA_DIR=str(data_dir),
        FLYWHEEL_LOG_JSON="1",
        # AGL's tests register http://model.test/v1: the server reaches it through the adapter's stub
        HTTP_PROXY=f"http://127.0.0.1:{stub_port}",
        NO_PROXY="127.0.0.1,localhost",
    )
    log = tmp_path / "server.log"
    argv = [FLYWHEEL, "agl-server", "--port", str(port), "--key", "main-key", "--model", "test-model"]
    argv += ["--val-temperature", "0", "--upstream", "http://127.0.0.1:9/v1"]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, server, log)
        report = tmp_path / "junit.xml"
        inner_env = clean_env()
        inner_env.update(
            AGL_ADAPTER_SERVER_URL=url,
            AGL_ADAPTER_STUB_PORT=str(stub_port),
            AGL_ADAPTER_KEYS=str(keys_file),
            NO_PROXY="*",
        )
        inner_env.pop("HTTP_PROXY", None)
        done = subprocess.run(
            [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={report}",
             "-o", "addopts=", *SELECTED],
            cwd=work, env=inner_env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        suite = ET.parse(report).getroot().find("testsuite")
        assert suite is not None, done.stdout[-3000:]
        counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
        assert done.returncode == 0, f"{counts}\n{done.stdout[-6000:]}\n{log.read_text()[-3000:]}"
        assert counts == {"tests": EXPECTED_TESTS, "failures": 0, "errors": 0, "skipped": 0}, counts
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    assert server.returncode == 0, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
