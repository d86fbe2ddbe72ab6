"""The short soak: ``flywheel up --tiny`` under steady agent traffic for a few minutes (the benchmark
tests/benchmarks/soak.py, shortened) keeps its memory flat and loses nothing.

Finished and abandoned training episodes, production sessions with feedback (half of them left to the
idle timeout), the trainer stepping. The idle timeout is 20 s here, so that abandoned episodes and
idle sessions are forgotten several times within the run; the gateway then holds only the episodes of
the last half minute or so.

The bound: the stack's RSS grows by at most ``SLOPE_BOUND_KB`` KB per 1,000 calls served past the first
minute (least squares over samples every 5 s). Before the in-process bus kept a small history and the
gateway forgot abandoned episodes, the slope was ~22,000 KB per 1,000 calls (every call event kept).
"""

from __future__ import annotations

import pytest

from tests.benchmarks.soak import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MINUTES = 2.5
SLOPE_BOUND_KB = 6_000.0  # KB per 1,000 calls; RSS sampling noise on a shared 2-core machine is ~±3,000


def test_memory_stays_flat_and_nothing_is_lost_under_steady_traffic() -> None:
    r = run(MINUTES, 4, sample_s=5.0, fit_from_s=60.0, env_extra={"FLYWHEEL_IDLE_TIMEOUT_S": "20"})
    assert r["failed"] == 0, r["errors"]
    assert r["answered"] > 200, r  # enough calls for a slope to mean something
    assert r["recorded"] == r["answered"], "calls answered but not in the event log"
    assert set(r["episodes"]) == {"finished", "abandoned", "production"}
    assert r["trainer_step"] and r["trainer_step"] > 0, "the trainer never stepped"
    # abandoned episodes and idle sessions (3 in 8 episodes of 3 calls) are forgotten after ~20 s: held
    # forever, they would be answered / 8 at the end; forgotten, those of the last ~22 s of 150
    assert r["gateway_open_episodes_end"] is not None and r["gateway_open_episodes_end"] <= r["answered"] / 16
    assert r["slope_kb_per_1k_calls"] <= SLOPE_BOUND_KB, r["samples"]
