"""``flywheel trainer run --dp N --backend torch|verl``: bad values get a one-line error, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app

runner = CliRunner()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("args", "message"),
    [(["--dp", "0"], "--dp must be at least 1"), (["--backend", "jax"], "--backend must be torch or verl")],
)
def test_run_refuses_bad_distributed_options(tmp_path: Path, args: list[str], message: str) -> None:
    r = runner.invoke(app, ["trainer", "run", "--model", str(tmp_path), "--dir", str(tmp_path), *args])
    assert r.exit_code == 2
    assert message in r.output
