"""Process checks shared by tests: does a child die with its killed parent?"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def child_gone_after_parent_killed(argv: list[str], cwd: Path, within_s: float) -> bool:
    """Start ``argv``, a parent that prints its child's pid as its first line and then waits; SIGKILL
    the parent; True when the child has exited within ``within_s`` (it must be alive before the kill)."""
    parent = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdin is not None
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid), "the child was not running before its parent was killed"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
        parent.stdin.close()
    deadline = time.monotonic() + within_s
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling another process's pid: no event to wait on
    return not alive(child_pid)
