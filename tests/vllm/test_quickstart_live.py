"""docs/usage.md's quickstart, followed as written: its files and commands are read from the page, run on a
fresh data directory, and the agent it shows (a LangChain program asking for ``gpt-4o-mini``) trains the
model vLLM serves.

The page's files (a code block after a line that names the file) are written into an empty working
directory, and its first shell block runs there as one bash script, as a user pastes it. One line is
not run: ``flywheel vllm serve``, which the test command has already run with these flags for the suite's
shared server (infra/scripts/test.sh, with ``--enable-lora`` and a log file besides). The test checks
that ``$(flywheel model smollm2)`` is the directory that server serves, and the page's
``http://127.0.0.1:8000`` becomes that server's URL. The second block (``flywheel trainer status
--json``) is then run until the trainer has taken the steps the page asks for, and ``flywheel up`` is
stopped as Ctrl-C stops it: SIGINT to its process group.

Then: the version trained is the one vLLM serves, every recorded call kept the agent's own model name
(``gpt-4o-mini``) with vLLM's token ids, and ``flywheel weights ls`` lists the saved checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.vllm.served import restore_base_weights

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Quickstart: your agent, your model, training"
PAGE_VLLM = "http://127.0.0.1:8000"
PAGE_PORT = 8100  # flywheel up's default port, which the page uses
BIN = Path(sys.executable).parent


def quickstart() -> tuple[dict[str, str], list[str]]:
    """The section's files (``name → text``: a block whose paragraph before it starts with the file's
    name in backticks) and its shell blocks, in the page's order."""
    text = (ROOT / "docs" / "usage.md").read_text()
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    files: dict[str, str] = {}
    shells: list[str] = []
    for m in re.finditer(r"((?:[^\n]+\n)*)\n```(\w+)\n(.*?)```", body, re.S):
        before, lang, code = m.group(1), m.group(2), m.group(3)
        named = re.match(r"`([\w.]+)`", before.strip().split("\n\n")[-1])
        if lang == "bash":
            shells.append(code)
        elif named:
            files[named.group(1)] = code
    return files, shells


def script(block: str, vllm_url: str) -> str:
    """The page's block as run here: its ``flywheel vllm serve`` line replaced by a note of the model it
    would serve (the suite's server is already up), its vLLM URL by the server's."""
    lines = []
    for line in block.splitlines():
        if line.startswith("flywheel vllm serve"):
            assert '--model "$MODEL"' in line and "--port 8000" in line, line
            lines.append('echo "$MODEL" > model.txt')
        else:
            lines.append(line.replace(PAGE_VLLM, vllm_url))
    return "\n".join(["set -e", *lines]) + "\n"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_quickstart_trains_the_agents_model_through_vllm(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    files, shells = quickstart()
    assert set(files) == {"tasks.jsonl", "agent.py"} and len(shells) == 2, (files, shells)
    run_block, status_block = shells
    steps, n, groups = (
        int(re.search(pattern, run_block).group(1))  # type: ignore[union-attr]
        for pattern in (r"--max-steps (\d+)", r"--n (\d+)", r"FLYWHEEL_TRAINER_BATCH_GROUPS=(\d+)")
    )
    assert port_free(PAGE_PORT), f"port {PAGE_PORT}, which the page's flywheel up uses, is taken"
    work = tmp_path / "work"
    work.mkdir()
    for name, code in files.items():
        (work / name).write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", XDG_DATA_HOME=str(tmp_path / "data-home"))
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", script(run_block, warm)],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's job
        )
    status: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 720
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            shown = subprocess.run(
                ["bash", "-c", status_block], cwd=work, env=env, capture_output=True, text=True, timeout=60
            )
            if shown.returncode == 0:
                status = json.loads(shown.stdout)
                if int(str(status["step"])) >= steps:
                    break
            time.sleep(3)
        # (excluded: no_signal counts the groups whose answers all scored alike)
        assert int(str(status.get("step", 0))) >= steps, (status, log_path.read_text()[-3000:])
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=180) == 0, log_path.read_text()[-3000:]
        out = log_path.read_text()
        assert "stopped cleanly" in out, out[-3000:]
        assert Path((work / "model.txt").read_text().strip()) == vllm_model_dir  # the server's model

        # The version trained is the version vLLM serves: each was reloaded into it.
        version = int(str(status["version"]))
        assert version >= steps and int(httpx.get(f"{warm}/weight_info").json()["weight_version"]) >= steps
        run = {"cwd": work, "env": env, "capture_output": True, "text": True, "timeout": 120}
        weights = subprocess.run(["flywheel", "weights", "ls", "--json"], check=True, **run)  # type: ignore[call-overload]
        assert max(row["version"] for row in json.loads(weights.stdout)) >= steps, weights.stdout
        # Every call kept the agent's own model name and carries vLLM's ids and logprobs.
        sql = (
            "SELECT JSONExtractString(payload, 'model') AS model, JSONExtractString(payload, 'upstream') AS "
            "upstream, JSONExtractBool(payload, 'token_faithful') AS faithful, count() AS calls FROM "
            "flywheel.events FINAL WHERE type = 'llm_call_recorded' GROUP BY model, upstream, faithful"
        )
        query = subprocess.run(["flywheel", "query", "--json", sql], check=True, **run)  # type: ignore[call-overload]
        rows = json.loads(query.stdout)["rows"]
        assert len(rows) == 1 and rows[0][:3] == ["gpt-4o-mini", "vllm", 1], rows
        assert int(rows[0][3]) >= steps * groups * n, rows  # a step: `groups` groups of n episodes
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        restore_base_weights(warm, vllm_model_dir)  # the served model again, for the tests that follow
