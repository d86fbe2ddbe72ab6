"""A child started by ``EngineProcess`` stops when its parent is killed (``exit_with_parent``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# The parent starts a child that arms the watcher and would otherwise sleep for a minute, prints the
# child's pid, and waits to be killed.
PARENT = """
import os, subprocess, sys
env = {**os.environ, "FLYWHEEL_ENGINE_PARENT_PID": str(os.getpid())}
child = subprocess.Popen(
    [sys.executable, "-c", "import time; from infra.engine_process import exit_with_parent; "
     "exit_with_parent(poll_s=0.05); print('armed', flush=True); time.sleep(60)"],
    env=env, stdout=subprocess.PIPE, text=True,
)
assert child.stdout is not None and child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
def test_child_stops_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid), "the child outlived its killed parent"


@pytest.mark.timeout(30)
def test_without_the_variable_nothing_is_armed() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_ENGINE_PARENT_PID"}
    code = "import threading; from infra.engine_process import exit_with_parent; exit_with_parent(); print(threading.active_count())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"
