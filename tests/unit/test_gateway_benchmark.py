"""The gateway benchmark's arithmetic: added latency against the direct path of the same window,
recording against the floor, medians over rounds (tests/benchmarks/gateway.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmarks.gateway import GOALS, _figures, median_figures

pytestmark = pytest.mark.timeout(30)


def _round(gateway_p50: float, *, floor: bool = True) -> dict[str, Any]:
    names = ["direct", "gateway_memory", *(["floor"] if floor else [])]
    p50 = {"direct": 1.0, "floor": 1.3, "gateway_memory": gateway_p50}
    direct_then = {"direct": 1.0, "floor": 1.1, "gateway_memory": 1.2}  # direct, taking turns with each
    rps = {"direct": 3000.0, "floor": 2000.0, "gateway_memory": 1000.0}
    return {
        "rows": {
            n: {"p50": 10 * p50[n], "p99": 20 * p50[n], "rps": rps[n], "cpu_ms": p50[n] / 10} for n in names
        },
        "serial": {n: {"p50": p50[n] / 2, "direct_p50": direct_then[n] / 2} for n in names},
        "sweep": {
            0.1: {
                n: {
                    "p50": p50[n],
                    "p99": 4 * p50[n],
                    "rate": 300.0,
                    "cpu_ms": 0.5,
                    "direct_p50": direct_then[n],
                    "direct_p99": 4 * direct_then[n],
                }
                for n in names
            }
        },
        "ttfts": {n: {"p50": 2 * p50[n], "direct_p50": 2 * direct_then[n]} for n in names},
    }


def test_added_is_against_the_same_window_and_recording_against_the_floor() -> None:
    f = _figures(_round(1.9), 0.1)
    assert f["gateway_memory_added_p50_ms"] == pytest.approx(1.9 - 1.2)
    assert f["floor_added_p50_ms"] == pytest.approx(1.3 - 1.1)
    assert f["gateway_memory_recording_p50_ms"] == pytest.approx((1.9 - 1.2) - (1.3 - 1.1))
    assert f["gateway_memory_serial_recording_p50_ms"] == pytest.approx(((1.9 - 1.2) - (1.3 - 1.1)) / 2)
    assert f["throughput_vs_floor"] == pytest.approx(0.5)
    assert f["stream_ttft_recording_p50_ms"] == pytest.approx(2 * ((1.9 - 1.2) - (1.3 - 1.1)))
    assert set(GOALS) >= {"gateway_memory_recording_p50_ms", "throughput_vs_floor"}
    assert not any("passthrough" in k for k in f)


def test_each_figure_is_the_median_of_the_rounds_that_have_it() -> None:
    rounds = [_figures(_round(p), 0.1) for p in (1.5, 9.0, 1.7)] + [_figures(_round(1.6, floor=False), 0.1)]
    f = median_figures(rounds)
    assert f["gateway_memory_added_p50_ms"] == pytest.approx(((1.6 - 1.2) + (1.7 - 1.2)) / 2)
    assert f["gateway_memory_recording_p50_ms"] == pytest.approx(1.7 - 1.2 - 0.2)  # 3 rounds had a floor
