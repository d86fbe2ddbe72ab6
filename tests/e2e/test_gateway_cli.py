"""The gateway's CLI as a user runs it: keys, `flywheel gateway` + `episodes open|show`, `flywheel record`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstream import BackgroundUpstream

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
AGENT = (
    "import openai; c = openai.OpenAI(); "
    "r = c.chat.completions.create(model='policy', messages=[{'role': 'user', 'content': 'hi'}]); "
    "print('AGENT GOT', r.choices[0].message.content)"
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "OPENAI_"))}
    return {
        **env,
        "FLYWHEEL_DATA_DIR": str(tmp_path),
        "FLYWHEEL_ADMIN_TOKEN": "cli-admin",
        "FLYWHEEL_LOG_JSON": "1",
        **extra,
    }


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _run(args: list[str], env: dict[str, str]) -> _Result:
    """``flywheel ARGS`` in-process (typer's runner); the real binary is exercised by `flywheel gateway`."""
    from typer.testing import CliRunner

    from flywheel.cli.main import app

    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("FLYWHEEL_", "OPENAI_"))}
    clean.update({k: v for k, v in env.items() if k.startswith("FLYWHEEL_")})
    result = CliRunner().invoke(app, args, env=clean)
    return _Result(result.exit_code, result.stdout, result.stderr)


@pytest.mark.timeout(60)
def test_keys_create_list_revoke(tmp_path: Path) -> None:
    env = _env(tmp_path)
    created = _run(["keys", "create", "--tenant", "acme"], env)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("fw_") and key not in (tmp_path / "gateway" / "keys.json").read_text()
    key_id = created.stderr.split("key_id:")[1].split()[0]
    listed = _run(["keys", "ls"], env)
    assert key_id in listed.stdout and "acme" in listed.stdout and key not in listed.stdout
    assert _run(["keys", "revoke", key_id], env).returncode == 0
    assert "revoked" in _run(["keys", "list", "--tenant", "acme"], env).stdout  # the old name, hidden
    bad = _run(["keys", "create", "--tenant", "no spaces"], env)
    assert bad.returncode == 1 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


@pytest.mark.timeout(90)
def test_record_runs_an_agent_and_prints_its_calls(tmp_path):
    with BackgroundUpstream() as up:
        env = _env(tmp_path)
        out = _run(["record", "--upstream", up.url, "--json", "--", sys.executable, "-c", AGENT], env)
        assert out.returncode == 0, out.stderr
        calls = json.loads(out.stdout)
        assert len(calls) == 1 and calls[0]["token_faithful"] and calls[0]["choices"][0]["token_ids"]
        assert calls[0]["choices"][0]["text"] == "The answer is 42."
        failing = _run(
            ["record", "--upstream", up.url, "--", sys.executable, "-c", "raise SystemExit(3)"], env
        )
        assert failing.returncode == 3 and "0 call(s) recorded" in failing.stdout
        assert _run(["record", "--upstream", up.url], env).returncode == 1


@pytest.mark.timeout(90)
def test_gateway_command_with_episodes_open_and_show(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with BackgroundUpstream() as up:
        env = _env(tmp_path, FLYWHEEL_GATEWAY_PORT=str(port))
        log = (tmp_path / "gateway.log").open("w")
        proc = subprocess.Popen([FLYWHEEL, "gateway", "--upstream", up.url], env=env, stderr=log, stdout=log)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{base}/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.1)  # polling a subprocess's port: no event to wait on
            opened = _run(["episodes", "open", "--gateway", base], env)
            assert opened.returncode == 0, opened.stderr
            episode_url = opened.stdout.strip()
            episode_id = episode_url.split("/episodes/")[1].split("/")[0]
            import openai

            with openai.OpenAI(base_url=episode_url, api_key="x") as client:
                reply = client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}]
                )
            assert reply.choices[0].message.content == "The answer is 42."
            shown = _run(["episodes", "show", episode_id, "--gateway", base, "--json"], env)
            data = json.loads(shown.stdout)
            assert data["calls"][0]["choices"][0]["text"] == "The answer is 42."
            table = _run(["episodes", "show", episode_id, "--gateway", base], env)
            assert "1 call(s) recorded" in table.stdout
            missing = _run(["episodes", "show", "0" * 32, "--gateway", base], env)
            assert missing.returncode == 1 and "404" in missing.stderr
            down = _run(["episodes", "open", "--gateway", "http://127.0.0.1:1"], env)
            assert down.returncode == 1 and "cannot reach" in down.stderr
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()
