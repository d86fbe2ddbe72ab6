"""Shared fixtures. Kafka fixtures live in tests/kafka_fixtures.py (registered below)."""

from __future__ import annotations

import gc
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.kafka_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``XDG_DATA_HOME`` of this whole run: a temporary directory, never the real home's.

    A setting left at its default puts Flywheel's data under ``$XDG_DATA_HOME/flywheel``
    (``infra.settings.default_data_dir``); this points it, for this process and every child started
    with its environment (``clean_env()`` helpers drop ``FLYWHEEL_*``, never ``XDG_DATA_HOME``), at a
    temporary directory. A ``FLYWHEEL_DATA_DIR`` inherited from the developer's shell goes too.
    ``tests/unit/test_data_dir.py`` checks that this holds."""
    home = tmp_path_factory.mktemp("xdg-data-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(home))
        mp.delenv("FLYWHEEL_DATA_DIR", raising=False)
        yield home


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Name child processes a test left running, then stop them.

    Every fixture has been torn down by now, so a live ``Popen`` here is a leak; left alone, Python
    would only say ``ResourceWarning: subprocess N is still running`` at exit, without saying whose.
    """
    # type(), not isinstance(): isinstance reads ``__class__``, which some deprecated module proxies
    # (torch.distributed.reduce_op) answer with a FutureWarning, an error under this suite's filters
    leaked = [
        obj
        for obj in gc.get_objects()
        if issubclass(type(obj), subprocess.Popen) and obj.returncode is None and obj.poll() is None
    ]
    if not leaked:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for proc in leaked:
        line = f"LEAKED CHILD PROCESS pid {proc.pid}: {proc.args!r}"
        if reporter is not None:
            reporter.write_line(line, red=True)
        proc.kill()
        proc.wait(10)
