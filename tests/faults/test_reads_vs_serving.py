"""Finding 1 of issue 21: event-log reads never stop a stack from serving, and Ctrl-C always stops it.

A real ``flywheel up`` (gateway, engine, worker, reward service, recorder on chdb) with agents calling
through the ``openai`` SDK while admin readers hammer ``/admin/eventlog`` — the fuzzer's body that
froze the stack included. Before the fix the process froze within seconds (a chdb read and the
recorder's insert deadlocked on chdb's lock and the GIL): ``/healthz`` stopped answering, agents'
calls hung and SIGINT did nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.faults.procs import TOKEN, Figures, flywheel_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
FUZZ_BODY = {"min_weight_version": -135453303929910784, "limit": 1000000.0}
LOAD_S = 8.0


def _agent(url: str, stop: threading.Event, out: dict[str, int], errors: list[str]) -> None:
    with httpx.Client(timeout=30, headers=ADMIN) as admin:
        while not stop.is_set():
            try:
                opened = admin.post(f"{url}/admin/episodes", json={}).json()
                client = openai.OpenAI(
                    base_url=opened["base_url"], api_key="unused", timeout=30, max_retries=0
                )
                for _ in range(3):
                    client.chat.completions.create(
                        model="policy",
                        messages=[{"role": "user", "content": "What is 1 plus 2?"}],
                        max_tokens=4,
                    )
                    out["calls"] += 1
                client.close()
                admin.post(f"{url}/admin/episodes/{opened['episode_id']}/finish", json={"reward": 1.0})
            except (httpx.HTTPError, openai.OpenAIError, KeyError) as exc:
                errors.append(f"agent: {type(exc).__name__}: {exc}"[:300])
                return


def _reader(url: str, stop: threading.Event, statuses: list[int], errors: list[str]) -> None:
    reads = [
        ("POST", "/admin/eventlog/episodes", FUZZ_BODY),
        ("POST", "/admin/eventlog/episodes", {"limit": 1000}),
        ("POST", "/admin/eventlog/query", {"sql": "SELECT type, count() FROM flywheel.events GROUP BY type"}),
        ("GET", "/admin/eventlog/counts", None),
        ("POST", "/admin/eventlog/calls", {"limit": 50}),
    ]
    with httpx.Client(timeout=60, headers=ADMIN) as client:
        i = 0
        while not stop.is_set():
            method, path, body = reads[i % len(reads)]
            i += 1
            try:
                statuses.append(client.request(method, f"{url}{path}", json=body).status_code)
            except httpx.HTTPError as exc:
                errors.append(f"reader: {type(exc).__name__} on {path}")
                return


def test_reads_never_stop_serving_and_ctrl_c_stops(tmp_path: Path) -> None:
    figures = Figures("reads_vs_serving")
    with flywheel_up(tmp_path) as up:
        stop = threading.Event()
        calls: dict[str, int] = {"calls": 0}
        statuses: list[int] = []
        errors: list[str] = []
        threads = [threading.Thread(target=_agent, args=(up.url, stop, calls, errors)) for _ in range(3)]
        threads += [threading.Thread(target=_reader, args=(up.url, stop, statuses, errors)) for _ in range(3)]
        for t in threads:
            t.start()
        worst_health_s = 0.0
        try:
            with httpx.Client(timeout=5) as client:
                ends = time.monotonic() + LOAD_S
                while time.monotonic() < ends and not errors:
                    started = time.monotonic()
                    try:
                        assert client.get(f"{up.url}/healthz").status_code == 200
                    except httpx.HTTPError as exc:
                        errors.append(f"healthz: {type(exc).__name__} (the stack froze)")
                        break
                    worst_health_s = max(worst_health_s, time.monotonic() - started)
                    stop.wait(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        hung = [t for t in threads if t.is_alive()]
        figures.calls, figures.ok = calls["calls"], calls["calls"]
        figures.server_errors = sum(1 for s in statuses if s >= 500 and s != 504)
        figures.extra = {"reads": len(statuses), "worst_healthz_ms": round(worst_health_s * 1000, 1)}
        # Ctrl-C stops it within its drain deadline, with everything written.
        interrupted = time.monotonic()
        up.interrupt()
        code = up.wait(40)
        figures.recover_s = round(time.monotonic() - interrupted, 2)
        figures.report()
        assert code == 0, f"flywheel up did not stop cleanly on Ctrl-C (code {code}): {up.output()}"
        assert not errors and not hung, (errors[:5], len(hung), up.output())
        assert calls["calls"] >= 6, calls
        assert statuses.count(400) >= 1 and 200 in statuses, statuses[:20]
        assert figures.server_errors == 0, statuses
        assert worst_health_s < 2.0


def test_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    with flywheel_up(tmp_path) as up:
        up.interrupt()
        time.sleep(0.05)  # the second Ctrl-C of an impatient user, right after the first
        started = time.monotonic()
        up.interrupt()
        code = up.wait(5)
        assert code is not None, f"a second Ctrl-C did not stop flywheel up at once: {up.output()}"
        assert time.monotonic() - started < 5
