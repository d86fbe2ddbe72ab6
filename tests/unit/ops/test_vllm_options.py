"""``flywheel vllm serve`` and ``flywheel up --engine vllm`` take vLLM's context length and tool parser, and
they reach vLLM's command line (``infra.engine.vllm_server.VllmLaunch.command``); bad values are one line,
exit 2. vLLM is not started: ``VllmServer.start`` is replaced by one that records the launch and fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.engine.vllm_server import VllmLaunch, VllmServer, VllmServerError

pytestmark = pytest.mark.timeout(60)


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[VllmLaunch]:
    """Every launch a command asks for; the start itself fails (exit 1) before any process runs."""
    seen: list[VllmLaunch] = []

    def start(launch: VllmLaunch, **_: Any) -> VllmServer:
        seen.append(launch)
        raise VllmServerError("not started in this test")

    monkeypatch.setattr(VllmServer, "start", staticmethod(start))
    for name in ("FLYWHEEL_BUS", "FLYWHEEL_ADMIN_URL", "FLYWHEEL_KAFKA_BOOTSTRAP", "FLYWHEEL_POLICIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    return seen


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_the_launch_defaults_to_hermes_tool_calls_and_2048_tokens() -> None:
    command = VllmLaunch(model=Path("/models/policy"), device="gpu").command()
    assert _flag(command, "--max-model-len") == "2048"
    assert "--enable-auto-tool-choice" in command and _flag(command, "--tool-call-parser") == "hermes"
    off = VllmLaunch(model=Path("/models/policy"), device="gpu", tool_call_parser=None).command()
    assert "--enable-auto-tool-choice" not in off and "--tool-call-parser" not in off


def test_vllm_serve_passes_the_context_length_and_tool_parser(
    launches: list[VllmLaunch], model: Path, tmp_path: Path
) -> None:
    args = ["vllm", "serve", "--model", str(model), "--device", "gpu", "--env", str(tmp_path / "env")]
    result = CliRunner().invoke(app, [*args, "--max-model-len", "8192", "--tool-call-parser", "llama3_json"])
    assert result.exit_code == 1 and "not started in this test" in result.stderr
    command = launches[-1].command()
    assert _flag(command, "--max-model-len") == "8192"
    assert "--enable-auto-tool-choice" in command and _flag(command, "--tool-call-parser") == "llama3_json"
    CliRunner().invoke(app, args)
    assert _flag(launches[-1].command(), "--tool-call-parser") == "hermes"
    assert _flag(launches[-1].command(), "--max-model-len") == "2048"
    CliRunner().invoke(app, [*args, "--tool-call-parser", "none"])
    assert "--enable-auto-tool-choice" not in launches[-1].command()


def test_up_with_engine_vllm_passes_the_context_length_and_tool_parser(
    launches: list[VllmLaunch], model: Path
) -> None:
    args = ["up", "--model", str(model), "--engine", "vllm", "--port", "0"]
    result = CliRunner().invoke(app, [*args, "--max-model-len", "4096", "--tool-call-parser", "mistral"])
    assert result.exit_code == 1 and "not started in this test" in result.stderr
    command = launches[-1].command()
    assert _flag(command, "--max-model-len") == "4096"
    assert "--enable-auto-tool-choice" in command and _flag(command, "--tool-call-parser") == "mistral"
    CliRunner().invoke(app, args)
    assert _flag(launches[-1].command(), "--tool-call-parser") == "hermes"
    assert _flag(launches[-1].command(), "--max-model-len") == "2048"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["vllm", "serve", "--tool-call-parser", "hermes; rm -rf /"], "--tool-call-parser takes"),
        (["vllm", "serve", "--tool-call-parser", ""], "--tool-call-parser takes"),
        (["vllm", "serve", "--max-model-len", "8"], "--max-model-len"),
        (["up", "--tool-call-parser", "hermes"], "give --engine vllm"),
        (["up", "--max-model-len", "4096"], "give --engine vllm"),
        (["up", "--engine", "vllm", "--tool-call-parser", "-x"], "--tool-call-parser"),
    ],
)
def test_bad_vllm_options_are_one_line_and_exit_2(
    launches: list[VllmLaunch], model: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, [*args, "--model", str(model)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert not launches


def test_a_long_last_log_line_keeps_its_head(tmp_path: Path) -> None:
    """vLLM's refusal of an unknown parser is one long line: the error shows the name, not only the list."""
    from infra.engine.vllm_server import last_line

    names = ",".join(f"parser_{i}" for i in range(80))
    log = tmp_path / "vllm.log"
    log.write_text(
        f"INFO starting\nKeyError: 'invalid tool call parser: nosuch (chose from {{ {names} }})'\n"
    )
    shown = last_line(log)
    assert shown.startswith("KeyError: 'invalid tool call parser: nosuch (chose from {")
    assert shown.endswith("parser_79 })'") and len(shown) < 400
