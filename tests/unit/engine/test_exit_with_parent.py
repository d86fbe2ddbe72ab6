"""A child started by ``EngineProcess`` stops when its parent is killed (``exit_with_parent``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import child_gone_after_parent_killed

REPO = Path(__file__).resolve().parents[3]

# The parent starts a child that arms the watcher and would otherwise sleep for a minute, prints the
# child's pid, and waits to be killed.
PARENT = """
import os, subprocess, sys
env = {**os.environ, "FLYWHEEL_ENGINE_PARENT_PID": str(os.getpid())}
child = subprocess.Popen(
    [sys.executable, "-c", "import time; from infra.engine.process import exit_with_parent; "
     "exit_with_parent(poll_s=0.05); print('armed', flush=True); time.sleep(60)"],
    env=env, stdout=subprocess.PIPE, text=True,
)
assert child.stdout is not None and child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.timeout(60)
def test_child_stops_when_its_parent_is_killed() -> None:
    gone = child_gone_after_parent_killed([sys.executable, "-c", PARENT], REPO, within_s=10)
    assert gone, "the child outlived its killed parent"


@pytest.mark.timeout(30)
def test_without_the_variable_nothing_is_armed() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_ENGINE_PARENT_PID"}
    code = "import threading; from infra.engine.process import exit_with_parent; exit_with_parent(); print(threading.active_count())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"
