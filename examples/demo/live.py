"""The live display: one table row per trainer step (rich on a terminal, plain lines otherwise)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from examples.demo.pipeline import StepPoint

COLUMNS = (
    ("step", "step", "{:.0f}"),
    ("version", "version", "{:.0f}"),
    ("reward", "reward", "{:.3f}"),
    ("success", "success", "{:.1%}"),
    ("trans/ep", "calls_per_episode", "{:.2f}"),
    ("tokens/s", "tokens_per_s", "{:.0f}"),
    ("staleness", "staleness_mean", "{:.2f}"),
    ("step s", "step_seconds", "{:.2f}"),
)


class LiveDisplay:
    def __init__(self, console: Console, rows: int = 12) -> None:
        self.console = console
        self.rows: deque[StepPoint] = deque(maxlen=rows)
        self.title = ""
        self._live: Live | None = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> LiveDisplay:
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def say(self, line: str) -> None:
        self.console.print(f"{time.perf_counter() - self._t0:6.0f}s  {line}", highlight=False)

    def step(self, point: StepPoint) -> None:
        self.rows.append(point)
        if self._live is not None:
            self._live.update(self._table())
        else:
            self.console.print(self._line(point), highlight=False)

    @staticmethod
    def _value(point: StepPoint, key: str, fmt: str) -> str:
        if key == "step":
            return fmt.format(point.step)
        if key == "version":
            return fmt.format(point.version)
        value = point.metrics.get(key)
        return fmt.format(value) if value is not None else "-"

    def _line(self, point: StepPoint) -> str:
        parts = [f"{name} {self._value(point, key, fmt)}" for name, key, fmt in COLUMNS]
        return f"{point.elapsed_s:6.0f}s  " + "  ".join(parts)

    def _table(self) -> Table:
        table = Table(title=self.title or "flywheel demo: training", expand=False)
        table.add_column("t")
        for name, _, _ in COLUMNS:
            table.add_column(name, justify="right")
        for p in self.rows:
            table.add_row(f"{p.elapsed_s:.0f}s", *(self._value(p, k, f) for _, k, f in COLUMNS))
        return table
