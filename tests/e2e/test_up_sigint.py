"""Ctrl-C in a terminal: SIGINT to ``flywheel up``'s whole process group, as a terminal sends it.

The terminal signals every process of its foreground group, so the training process
(``trainer.backends.process``) and the engine child hear the Ctrl-C too, not only ``flywheel up``.
The stack must still stop cleanly: the trainer finishes, writes its final checkpoint (here the only
one: ``checkpoint_every`` is far away), and every process it started is gone. A second Ctrl-C ends
it at once and leaves no process behind either: the training child and the engine child (each in a
session of its own, out of the terminal's reach) exit once their parent is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "sigint-e2e-admin-token-0123456789abcdef"
PROBLEMS = ["What is 2 plus 3?", "What is 4 plus 1?", "What is 7 plus 2?", "What is 3 plus 3?"]
TRAINING_CHILD = "trainer.backends.process"
ENGINE_CHILD = "flywheel.cli.main engine"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, ppid)`` of a process from /proc, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the name, in parentheses, may hold spaces
    return fields[0], int(fields[1])


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits on a reaper we do not control)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` now, with its command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        todo.extend(children.get(pid, []))
    return found


def _group_left(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still running."""
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _running(int(entry.name)):
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    left.append(int(entry.name))
    return left


def _wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling other processes' state: no event to wait on
    return left


class _Up:
    """``flywheel up --tiny`` in a process group of its own, as a terminal's foreground job."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp_path / "data"
        self.log_path = tmp_path / "up.log"
        self._log = self.log_path.open("w")
        argv = [FLYWHEEL, "up", "--tiny", "--port", str(self.port), "--data-dir", str(self.data)]
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.pgid = self.proc.pid

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s  # a cold start builds the toy model and imports torch
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"flywheel up exited with {self.proc.returncode}: {self.output()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(0.2)
        pytest.fail(f"flywheel up was not ready within {timeout_s} s: {self.output()[-2000:]}")

    def ctrl_c(self) -> None:
        os.killpg(self.pgid, signal.SIGINT)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Whatever the test did: nothing of this stack is left running."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.proc.wait(30)
        self._log.close()


@contextlib.contextmanager
def _flywheel_up(tmp_path: Path, **extra: str) -> Iterator[_Up]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_TRAINER_TORCH_THREADS": "1", **extra})
    up = _Up(tmp_path, env)
    try:
        up.wait_ready()
        yield up
    finally:
        up.close()


def _production_sessions(up: _Up) -> None:
    """Production sessions with thumbs up and down: each counts as a group toward the trainer's step."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_ADMIN_TOKEN": TOKEN, "FLYWHEEL_DATA_DIR": str(up.data)})
    created = subprocess.run(
        [FLYWHEEL, "keys", "create", "--tenant", "acme"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    headers = {"Authorization": f"Bearer {created.stdout.strip()}"}
    with httpx.Client(base_url=up.url, headers=headers, timeout=60) as http:
        for i, problem in enumerate(PROBLEMS):
            session = f"user-{i}"
            answer = http.post(
                "/v1/chat/completions",
                json={"model": "policy", "messages": [{"role": "user", "content": problem}], "max_tokens": 6},
                headers={"X-Flywheel-Session": session},
            )
            assert answer.status_code == 200, answer.text
            rating = 1 if i % 2 == 0 else -1
            assert (
                http.post("/v1/feedback", json={"session_id": session, "rating": rating}).status_code == 200
            )
            assert http.post(f"/v1/sessions/{session}/end").status_code == 200


def _stepped(up: _Up, timeout_s: float = 120.0) -> int:
    """The trainer's step once it is at least 1 (its status file: the trainer is in another process)."""
    from trainer.status import read_status

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = read_status(up.data / "trainer")
        if status is not None and status.step >= 1:
            return status.step
        if up.proc.poll() is not None:
            pytest.fail(f"flywheel up exited: {up.output()[-2000:]}")
        time.sleep(0.5)
    pytest.fail(f"the trainer did not step within {timeout_s} s: {up.output()[-3000:]}")


def test_ctrl_c_to_the_group_stops_cleanly_with_the_final_checkpoint(tmp_path: Path) -> None:
    from flywheel.assembly import TINY_CACHE
    from trainer.backends.torch_backend import load_backend
    from trainer.checkpoints import CheckpointStore
    from trainer.config import AlgorithmConfig

    extra = {"FLYWHEEL_TRAINER_BATCH_GROUPS": str(len(PROBLEMS)), "FLYWHEEL_TRAINER_CHECKPOINT_EVERY": "1000"}
    with _flywheel_up(tmp_path, **extra) as up:
        _production_sessions(up)
        step = _stepped(up)
        children = _descendants(up.proc.pid)
        assert any(TRAINING_CHILD in cmd for cmd in children.values()), children
        up.ctrl_c()  # the terminal's Ctrl-C: every process of the foreground group
        code = up.wait(90)
        assert code is not None, f"flywheel up did not stop on Ctrl-C: {up.output()[-2000:]}"
        output = up.output()
    assert code == 0, output[-2000:]
    assert "stopped cleanly" in output, output[-2000:]
    assert "stack_stop_failed" not in output and "Traceback" not in output, output[-3000:]
    assert not _wait_gone(list(children), 10), {p: children[p] for p in children if _running(p)}
    assert not _group_left(up.pgid)

    # The final checkpoint: written on the way out, it loads with the trainer's own code.
    latest = CheckpointStore(up.data / "trainer").latest()
    assert latest is not None, "no checkpoint was written on Ctrl-C"
    assert latest.meta.step >= step, (latest.meta, step)
    backend = load_backend(TINY_CACHE, AlgorithmConfig(), torch_threads=1)
    backend.load_checkpoint(latest.path, latest.meta.version)
    assert backend.version == latest.meta.version >= 1


def test_a_second_ctrl_c_to_the_group_ends_everything_at_once(tmp_path: Path) -> None:
    # the engine in a child process too (FLYWHEEL_ENGINE_PROCESS): no child of the stack may stay behind
    with _flywheel_up(tmp_path, FLYWHEEL_ENGINE_PROCESS="true") as up:
        children = _descendants(up.proc.pid)
        assert any(TRAINING_CHILD in cmd for cmd in children.values()), children
        assert any(ENGINE_CHILD in cmd for cmd in children.values()), children
        up.ctrl_c()
        time.sleep(0.05)  # the second Ctrl-C of an impatient user, right after the first
        started = time.monotonic()
        up.ctrl_c()
        code = up.wait(10)
        assert code is not None, f"a second Ctrl-C did not stop flywheel up: {up.output()[-2000:]}"
        assert code in (0, -signal.SIGINT), up.output()[-2000:]
        # The training process outlives its parent by at most its parent check, not by a step or a save.
        left = _wait_gone(list(children), 10)
        assert not left, {p: children[p] for p in left}
        assert time.monotonic() - started < 15
        assert not _group_left(up.pgid)
