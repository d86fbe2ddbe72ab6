"""A key made in one directory is the key ``flywheel up`` serves from another: with no
``FLYWHEEL_DATA_DIR`` the CLI keeps its data in one place per user (``$XDG_DATA_HOME/flywheel``), never
under the working directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from flywheel.stack import StackSettings
from gateway.app import default_keystore

pytestmark = pytest.mark.timeout(60)


def test_keys_made_in_one_directory_are_seen_from_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLYWHEEL_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    here, there = tmp_path / "project", tmp_path / "elsewhere"
    here.mkdir()
    there.mkdir()
    runner = CliRunner()

    monkeypatch.chdir(here)
    made = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--json"])
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)

    monkeypatch.chdir(there)
    listed = runner.invoke(app, ["keys", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["key_id"], r["tenant"]) for r in json.loads(listed.stdout)] == [(created["key_id"], "acme")]
    # the store the embedded stack's gateway reads is that one
    assert default_keystore(StackSettings().gateway).tenant_for(created["key"]) == "acme"
    assert (tmp_path / "xdg" / "flywheel" / "gateway" / "keys.json").is_file()
    assert not (here / ".flywheel").exists() and not (there / ".flywheel").exists()
