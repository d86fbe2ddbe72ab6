"""Agent Lightning 1.0.2 for the compatibility tests: its sdist and a Python 3.12 venv, both cached.

    sdist = agl_sdist()          # ~/.cache/flywheel/agl/agentlightning-1.0.2 (unpacked), fetched by pip
    python = agl_python()        # $FLYWHEEL_AGL_ENV/bin/python with agentlightning + test deps

Nothing of AGL is in this repository: pip fetches the sdist (``--no-binary :all:``), and the venv is
built from it, at ``FLYWHEEL_AGL_ENV`` (default ~/.cache/flywheel/venv-agl). AGL needs Python ≥ 3.12
(Flywheel runs on 3.11): ``FLYWHEEL_PYTHON312``, or a 3.12+ of pyenv's (under ``PYENV_ROOT``, default
~/.pyenv), or ``python3.12``/``python3.13`` on PATH. Without one the tests skip (``CI=true``: they fail).
A file lock keeps two test processes from building the venv at once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

VERSION = "1.0.2"
CACHE = Path.home() / ".cache" / "flywheel"
SDIST_DIR = CACHE / "agl"
VENV = Path(os.environ.get("FLYWHEEL_AGL_ENV", str(CACHE / "venv-agl")))
# AGL's own dev extras for its tests (pyproject [project.optional-dependencies] dev, the test part)
TEST_DEPS = ["pytest>=8.3.0", "pytest-asyncio>=0.25.0", "openai>=2.0.0,<3", "sympy>=1.13.0"]


def _pyenv_pythons() -> list[str]:
    """pyenv's interpreters of 3.12 and later, oldest first (its shims on PATH may refuse to run)."""
    root = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv")))
    return [str(path) for path in sorted(root.glob("versions/3.1[2-9]*/bin/python3"))]


def python312() -> str | None:
    """A Python ≥ 3.12 that runs (a pyenv shim on PATH may refuse to when another version is set)."""
    for candidate in (
        os.environ.get("FLYWHEEL_PYTHON312"),
        *_pyenv_pythons(),
        shutil.which("python3.12"),
        shutil.which("python3.13"),
    ):
        if not candidate or not Path(candidate).is_file():
            continue
        probe = [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]
        if subprocess.run(probe, capture_output=True, env=clean_env(), check=False).returncode == 0:
            return candidate
    return None


def unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Agent Lightning {VERSION} unavailable: {reason}")
    pytest.skip(f"Agent Lightning {VERSION} unavailable: {reason}")


@contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".agl.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def clean_env() -> dict[str, str]:
    """The environment without Flywheel's Python settings (a 3.12 interpreter must not see them)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(argv: list[str], what: str, timeout_s: float = 600) -> None:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=clean_env()
    )
    if done.returncode != 0:
        unavailable(f"{what} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def agl_sdist() -> Path:
    """The unpacked sdist (its tests, docs and examples), fetched with pip once."""
    py = python312()
    if py is None:
        unavailable("no Python ≥ 3.12 (set FLYWHEEL_PYTHON312)")
    assert py is not None
    root = SDIST_DIR / f"agentlightning-{VERSION}"
    with _locked():
        if not (root / "pyproject.toml").is_file():
            archive = SDIST_DIR / f"agentlightning-{VERSION}.tar.gz"
            if not archive.is_file():
                _run(
                    [py, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                     f"agentlightning=={VERSION}", "-d", str(SDIST_DIR)],
                    "pip download",
                )  # fmt: skip
            with tarfile.open(archive) as tar:
                tar.extractall(SDIST_DIR, filter="data")
    return root


def agl_python() -> Path:
    """The venv's python, with agentlightning (from the sdist) and AGL's test dependencies."""
    py = python312()
    assert py is not None
    sdist = agl_sdist()
    python = VENV / "bin" / "python"
    ready = VENV / f".agentlightning-{VERSION}-ready"
    with _locked():
        if not ready.is_file():
            shutil.rmtree(VENV, ignore_errors=True)
            _run([py, "-m", "venv", str(VENV)], "python3.12 -m venv")
            _run([str(python), "-m", "pip", "install", "-q", str(sdist), *TEST_DEPS], "pip install")
            ready.touch()
    return python
