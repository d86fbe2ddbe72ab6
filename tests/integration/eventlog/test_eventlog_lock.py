"""A chdb directory held by another process: detected, named with its pid, said in one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.eventlog.client import open_reader
from infra.eventlog.errors import EventLogLockedError, EventLogUnavailableError
from infra.eventlog.lock import chdb_holder, is_held_elsewhere
from infra.eventlog.store import ChdbStore

pytestmark = pytest.mark.timeout(90)

HOLDER = """
import sys
from pathlib import Path
from infra.logging import configure_logging
from infra.eventlog.store import ChdbStore
configure_logging("WARNING", json=True)
store = ChdbStore(Path(sys.argv[1]), "locktest")
store.migrate()
store.insert([])
print("ready", flush=True)
sys.stdin.read()
store.close()
"""


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    data_dir = tmp_path_factory.mktemp("locked")
    path = data_dir / "chdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "the holder did not start"  # its own signal
        yield path, proc
    finally:
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_holder_is_named_with_its_pid(held: tuple[Path, subprocess.Popen[str]]) -> None:
    path, proc = held
    holder = chdb_holder(path)
    assert holder is not None and holder.pid == proc.pid
    assert is_held_elsewhere(path)


def test_opening_a_held_directory_fails_in_one_line(held: tuple[Path, subprocess.Popen[str]]) -> None:
    path, proc = held
    with pytest.raises(EventLogLockedError) as info:
        ChdbStore(path, "locktest")
    message = f"{type(info.value).__name__}: {info.value}"
    assert "\n" not in message
    assert f"pid {proc.pid}" in message and str(path) in message and "--url" in message
    with pytest.raises(EventLogLockedError):
        open_reader(admin_url=None, admin_token="t", chdb_path=path)


def test_cli_read_of_a_held_directory_exits_1_with_one_line(
    held: tuple[Path, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, proc = held
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(path.parent))
    monkeypatch.delenv("FLYWHEEL_ADMIN_URL", raising=False)
    result = CliRunner().invoke(app, ["query", "SELECT count() FROM flywheel.events"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("EventLogLockedError: ") and f"pid {proc.pid}" in lines[0]
    migrate = CliRunner().invoke(app, ["db", "migrate"])
    assert migrate.exit_code == 1 and migrate.stderr.startswith("EventLogLockedError: ")


def test_unreachable_admin_url_is_one_line() -> None:
    reader = open_reader(admin_url="http://127.0.0.1:9", admin_token="t", chdb_path=Path("/nonexistent"))
    with pytest.raises(
        EventLogUnavailableError, match=r"cannot reach the Flywheel admin API at http://127\.0\.0\.1:9"
    ):
        reader.counts()
    reader.close()


def test_directory_opens_once_released(held: tuple[Path, subprocess.Popen[str]]) -> None:
    path, proc = held
    assert proc.stdin is not None
    proc.stdin.close()  # the holder closes its store and exits
    assert proc.wait(timeout=30) == 0
    assert chdb_holder(path) is None  # the stale status file of a finished process is not a lock
    store = ChdbStore(path, "locktest")
    try:
        assert store.migrate() == []  # the other process's schema is there
    finally:
        store.close()
