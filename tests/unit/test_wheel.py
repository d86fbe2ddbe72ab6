"""The wheel ships Flywheel's packages, nothing of the repository around them (not examples/, not tests/)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"schemas", "infra", "gateway", "rollout_worker", "reward_service", "trainer", "flywheel"}


@pytest.mark.timeout(120)
def test_the_wheel_holds_only_flywheels_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hatchling.build

    monkeypatch.chdir(ROOT)  # the PEP 517 hook builds the project in the working directory
    name = hatchling.build.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as wheel:
        names = wheel.namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == PACKAGES
    assert not [n for n in names if n.endswith(".png") or "__pycache__" in n]
    # the demo and its agents run from a checkout; the tests stay in it too
    assert not [n for n in names if n.startswith(("examples/", "tests/", "demo_agents/"))]
    assert "flywheel/cli/main.py" in names
    # the web view serves its charting library and script from the package: nothing from a CDN
    assert {"chart.umd.min.js", "LICENSE.chartjs.md", "ui.js", "ui.css"} <= {
        n.rsplit("/", 1)[1] for n in names if n.startswith("flywheel/ui/static/")
    }
