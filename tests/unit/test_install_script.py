"""``infra/scripts/install.sh`` puts ``flywheel`` on PATH (a link in ``~/.local/bin``), and the package
declares the ``flywheel`` console script that ``pip install .`` writes.

The script runs with ``--no-sync`` against this test's own environment and a temporary ``HOME``: the
link, the hint when ``~/.local/bin`` is not on PATH, and ``flywheel --version`` through the link."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "scripts" / "install.sh"
VENV = Path(sys.executable).parent.parent  # not resolved: the environment, not its base interpreter
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _install(home: Path, path: str = SYSTEM_PATH, venv: Path = VENV) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": path, "UV_PROJECT_ENVIRONMENT": str(venv)}
    return subprocess.run(
        ["bash", str(SCRIPT), "--no-sync"], env=env, capture_output=True, text=True, timeout=30
    )


def test_install_links_flywheel_into_local_bin(tmp_path: Path) -> None:
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    link = tmp_path / ".local" / "bin" / "flywheel"
    assert link.is_symlink()
    assert Path(link.readlink()) == VENV.absolute() / "bin" / "flywheel"
    # ~/.local/bin is not on this PATH: the script says which line to add
    assert "is not on PATH" in done.stderr
    assert 'export PATH="$HOME/.local/bin:$PATH"' in done.stderr
    env = {"HOME": str(tmp_path), "PATH": f"{link.parent}:{SYSTEM_PATH}", "PYTHONPATH": str(REPO)}
    version = subprocess.run(["flywheel", "--version"], env=env, capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip()

    again = _install(tmp_path, path=f"{link.parent}:{SYSTEM_PATH}")  # on PATH now: no hint; idempotent
    assert again.returncode == 0, again.stderr
    assert "is not on PATH" not in again.stderr
    assert link.is_symlink()


def test_a_file_that_is_not_a_link_is_left_alone(tmp_path: Path) -> None:
    own = tmp_path / ".local" / "bin" / "flywheel"
    own.parent.mkdir(parents=True)
    own.write_text("#!/bin/sh\necho mine\n")
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is not a link: left alone" in done.stderr
    assert not own.is_symlink() and own.read_text() == "#!/bin/sh\necho mine\n"


def test_without_the_environment_it_fails(tmp_path: Path) -> None:
    done = _install(tmp_path, venv=tmp_path / "no-venv")
    assert done.returncode == 1
    assert "run without --no-sync" in done.stderr
    assert not (tmp_path / ".local" / "bin" / "flywheel").exists()


def test_the_package_declares_the_flywheel_console_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``pip install .`` turns into ``bin/flywheel``: the wheel's entry point, and it exists."""
    import hatchling.build

    from flywheel.cli import main

    monkeypatch.chdir(REPO)  # the PEP 517 hook reads the project in the working directory
    name = hatchling.build.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as wheel:
        text = wheel.read(f"{name.split('-')[0]}-{name.split('-')[1]}.dist-info/entry_points.txt").decode()
    points = configparser.ConfigParser()
    points.read_string(text)
    assert points["console_scripts"]["flywheel"] == "flywheel.cli.main:main"
    assert callable(main.main)
