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


def test_export_on_is_measured_beside_the_same_gateway_off_and_counts_what_the_sink_got() -> None:
    r = _round(1.9)
    for part in ("rows", "serial", "sweep", "ttfts"):  # gateway_memory_otel: 0.3 ms slower everywhere
        table = r[part][0.1] if part == "sweep" else r[part]
        on = dict(table["gateway_memory"])
        on["p50"] += 0.3
        table["gateway_memory_otel"] = on
    r["rows"]["gateway_memory_otel"]["rps"] = 800.0
    r["rows"]["gateway_memory_otel"]["cpu_ms"] += 0.25
    r["exports"] = {"gateway_memory_otel": {"calls": 2000.0, "spans": 1990.0, "dropped": 10.0}}
    f = _figures(r, 0.1)
    assert f["gateway_memory_otel_added_p50_ms"] == pytest.approx(1.9 + 0.3 - 1.2)
    assert f["gateway_memory_otel_recording_p50_ms"] == pytest.approx((1.9 + 0.3 - 1.2) - (1.3 - 1.1))
    assert f["otel_export_added_p50_ms"] == pytest.approx(0.3)
    assert f["otel_export_cpu_ms_per_call"] == pytest.approx(0.25)
    assert f["gateway_memory_otel_throughput_vs_floor"] == pytest.approx(0.4)
    assert f["gateway_memory_otel_stream_ttft_overhead_p50_ms"] == pytest.approx(2 * 1.9 + 0.3 - 2 * 1.2)
    assert f["gateway_memory_otel_spans_dropped"] == 10.0
    assert f["gateway_memory_otel_spans_received"] == 1990.0
    for key in ("added_p50_ms", "added_p99_ms", "recording_p50_ms", "spans_dropped"):
        assert f"gateway_memory_otel_{key}" in GOALS
