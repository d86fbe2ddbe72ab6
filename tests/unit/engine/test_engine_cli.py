from __future__ import annotations

from typer.testing import CliRunner

from flywheel.cli.main import app


def test_engine_command_refuses_a_path_without_a_model(tmp_path) -> None:
    result = CliRunner().invoke(app, ["engine", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a Hugging Face model directory" in result.output


def test_engine_command_is_registered_with_its_options() -> None:
    result = CliRunner().invoke(app, ["engine", "--help"])
    assert result.exit_code == 0
    for option in ("--model", "--port", "--threads", "--max-num-seqs", "--admin-token"):
        assert option in result.output
