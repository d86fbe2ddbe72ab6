"""The demo's plot and live display read the trainer's own metric names."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from infra.application.demo.live import LiveDisplay
from infra.application.demo.pipeline import StepPoint
from infra.application.demo.report import _series, plot, write_json
from trainer.batching import BatchStats


def _points() -> list[StepPoint]:
    out = []
    for step in range(1, 6):
        stats = BatchStats(reward_mean=0.1 * step, success_rate=0.1 * step, transitions_per_episode=1.0)
        metrics = {**stats.as_metrics(), "tokens_per_s": 900.0, "calls_per_episode": 3.0 - 0.2 * step}
        out.append(StepPoint(step, step, float(step), metrics))
    return out


def test_plot_and_json(tmp_path: Path) -> None:
    points = _points()
    assert _series(points, "reward")[1] == [p.metrics["reward"] for p in points]
    assert len(_series(points, "calls_per_episode")[1]) == 5
    result = {"success": 0.5, "transitions_per_episode": 2.0}
    plot(tmp_path / "p.png", [{"seed": 0, "points": points, "before": result, "after": result}])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    write_json(tmp_path / "r.json", {"a": 1})
    assert (tmp_path / "r.json").read_text().strip().startswith("{")


def test_live_display_prints_a_line_per_step_off_a_terminal() -> None:
    buf = io.StringIO()
    display = LiveDisplay(Console(file=buf, width=200, force_terminal=False))
    with display:
        for p in _points():
            display.step(p)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5
    assert "reward 0.500" in lines[-1] and "trans/ep 2.00" in lines[-1] and "tokens/s 900" in lines[-1]
