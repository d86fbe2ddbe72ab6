"""``flywheel demo`` as a user runs it, for the demo end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_demo(
    *args: str, timeout_s: float, warnings_are_errors: bool = False
) -> subprocess.CompletedProcess[str]:
    """``flywheel demo ARGS`` from the repository root, on the embedded stack whatever the shell's
    ``FLYWHEEL_BUS`` says; stdout and stderr captured as text."""
    env = {**os.environ, "FLYWHEEL_ENV": "development"}
    env.pop("FLYWHEEL_BUS", None)
    python = [sys.executable]
    if warnings_are_errors:
        env["PYTHONWARNINGS"] = "error"
        python += ["-W", "error"]
    return subprocess.run(
        [*python, "-m", "flywheel.cli.main", "demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
