"""A server beyond loopback refuses the placeholder or a short admin token (docs/operating.md, "Tenancy
and access").

Each command that listens (``flywheel up``, ``ui``, ``gateway``, ``recorder``, ``agl-server``,
``engine``) is run as a user runs it, on ``--host 0.0.0.0`` (or its host setting): with the placeholder,
an empty or a short token it exits 1 with one line naming the setting, before it binds anything or loads
a model. On a loopback address the placeholder stays usable (development); production mode needs 32
characters wherever it listens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.settings import DEV_ADMIN_TOKEN, FlywheelSettings, exposure_problem, is_loopback

pytestmark = pytest.mark.timeout(120)

runner = CliRunner()
LONG = "0123456789abcdef0123456789abcdef"  # 32 characters


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FLYWHEEL_ENV", "development")
    for name in ("FLYWHEEL_ADMIN_TOKEN", "FLYWHEEL_ENGINE_ADMIN_TOKEN", "FLYWHEEL_GATEWAY_HOST"):
        monkeypatch.delenv(name, raising=False)


def _refused(args: list[str], setting: str, what: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, (args, result.output)
    assert result.output.count("\n") == 1 and result.output.startswith("error: refusing to listen on 0.0.0.0")
    assert f"{setting} is {what}" in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["up", "--tiny", "--host", "0.0.0.0", "--port", "1"],
        ["ui", "--host", "0.0.0.0", "--port", "1"],
        ["gateway", "--host", "0.0.0.0", "--port", "1"],
        [
            "agl-server",
            "--host",
            "0.0.0.0",
            "--port",
            "1",
            "--key",
            "k",
            "--model",
            "m",
            "--upstream",
            "http://127.0.0.1:1/v1",
        ],
    ],
)
def test_a_public_bind_with_the_placeholder_or_a_short_token_is_refused(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _refused(args, "FLYWHEEL_ADMIN_TOKEN", "the placeholder")
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "short-token")
    _refused(args, "FLYWHEEL_ADMIN_TOKEN", "11 characters long")


def test_the_recorder_and_the_engine_check_their_own_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_RECORDER_HOST", "0.0.0.0")
    _refused(["recorder", "--port", "1"], "FLYWHEEL_ADMIN_TOKEN", "the placeholder")
    model = tmp_path / "model"
    model.mkdir()
    _refused(
        ["engine", "--model", str(model), "--host", "0.0.0.0"],
        "FLYWHEEL_ENGINE_ADMIN_TOKEN (--admin-token)",
        "empty",
    )
    _refused(
        ["engine", "--model", str(model), "--host", "0.0.0.0", "--admin-token", "abc"],
        "FLYWHEEL_ENGINE_ADMIN_TOKEN (--admin-token)",
        "3 characters long",
    )
    # a real token passes the check: the engine then fails on the model it was given, not the token
    result = runner.invoke(app, ["engine", "--model", str(model), "--host", "0.0.0.0", "--admin-token", LONG])
    assert result.exit_code == 2 and "no config.json" in result.output, result.output


def test_loopback_keeps_the_placeholder_and_production_needs_32_characters() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com", ""))
    assert exposure_problem("127.0.0.1", DEV_ADMIN_TOKEN) is None
    assert exposure_problem("0.0.0.0", LONG) is None
    assert exposure_problem("0.0.0.0", LONG[:-1]) is not None
    with pytest.raises(ValueError, match="at least 32 random characters when FLYWHEEL_ENV=production"):
        FlywheelSettings(env="production", admin_token="a-real-but-short-secret")
    assert FlywheelSettings(env="production", admin_token=LONG).admin_token.get_secret_value() == LONG
