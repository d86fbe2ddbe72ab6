"""``flywheel otel-export``: the exporter as a process of its own (docs/observability.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

CLI = [sys.executable, "-m", "flywheel.cli.main", "otel-export"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return {**env, "FLYWHEEL_BUS": "memory", "FLYWHEEL_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}


def test_without_an_endpoint_it_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(CLI, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: otel-export: set FLYWHEEL_OTLP_ENDPOINT (the OTLP/HTTP collector)"], done.stderr
    assert "Traceback" not in done.stderr


def test_it_runs_until_a_signal_and_stops_cleanly(tmp_path: Path) -> None:
    with subprocess.Popen(
        [*CLI, "--endpoint", "http://127.0.0.1:9/"],
        env=_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        seen = []
        try:
            for line in proc.stdout:  # the service's log lines, until it says it started
                seen.append(line)
                if "service_started" in line:
                    break
            assert any("otel_export.started" in line for line in seen), seen
            proc.send_signal(signal.SIGTERM)
            rest = proc.stdout.read()
            assert proc.wait(timeout=30) == 0, rest
        finally:  # a failed or timed-out test must not leave Popen's exit waiting on a running service
            proc.kill()
    assert "service_stopped" in rest
