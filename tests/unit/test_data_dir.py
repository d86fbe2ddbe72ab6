"""The default data directory is absolute and one per user (``infra.settings.default_data_dir``):
``$FLYWHEEL_DATA_DIR``, else ``$XDG_DATA_HOME/flywheel``, else ``~/.local/share/flywheel``, whatever the
working directory. And this test run keeps it out of the real home (``tests/conftest.py::data_home``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.stack import StackSettings
from gateway.settings import GatewaySettings
from infra.settings import FlywheelSettings, default_data_dir

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def test_the_default_follows_xdg_data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FLYWHEEL_DATA_DIR", raising=False)
    want = tmp_path / "xdg" / "flywheel"
    assert default_data_dir() == want
    assert FlywheelSettings().data_dir == want
    assert GatewaySettings().data_dir == want
    stack = StackSettings()
    assert stack.data_dir == stack.gateway.data_dir == stack.trainer.data_dir == want


def test_without_xdg_data_home_it_is_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("FLYWHEEL_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert FlywheelSettings().data_dir == tmp_path / ".local" / "share" / "flywheel"
    # a relative XDG_DATA_HOME is invalid (XDG Base Directory specification): ignored
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert FlywheelSettings().data_dir == tmp_path / ".local" / "share" / "flywheel"


def test_the_default_is_absolute_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLYWHEEL_DATA_DIR", raising=False)
    seen = []
    for here in ("a", "b/c"):
        (tmp_path / here).mkdir(parents=True)
        monkeypatch.chdir(tmp_path / here)
        seen.append(FlywheelSettings().data_dir)
    assert seen[0] == seen[1]
    assert seen[0].is_absolute()


def test_flywheel_data_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "mine"))
    assert FlywheelSettings().data_dir == tmp_path / "mine"
    assert FlywheelSettings(data_dir=tmp_path / "given").data_dir == tmp_path / "given"


def test_this_run_keeps_the_data_out_of_the_real_home(data_home: Path) -> None:
    """The guard holds here and in a child started with this environment, as the e2e tests start them."""
    assert "FLYWHEEL_DATA_DIR" not in os.environ
    assert FlywheelSettings().data_dir == data_home / "flywheel"
    code = "from infra.settings import FlywheelSettings; print(FlywheelSettings().data_dir)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=data_home, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == data_home / "flywheel"
