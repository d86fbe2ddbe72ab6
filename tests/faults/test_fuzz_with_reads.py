"""The fault suite's fuzzer: schemathesis over the gateway's OpenAPI (event-log routes included) while
agents call and admin readers hammer ``/admin/eventlog``, on a gateway that records into chdb.

No request the fuzzer sends may get a 5xx; the agents' calls all succeed; ``/healthz`` keeps
answering; every call answered is recorded once in the event log.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from infra.eventlog.api import create_eventlog_router
from infra.eventlog.recorder import RECORDER_GROUP, Recorder
from infra.eventlog.store import ChdbStore
from schemas import EPISODES
from tests.fakes.gateway_harness import ADMIN, BackgroundGateway
from tests.fakes.waiting import wait_until
from tests.faults.procs import Figures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]
FUZZ_BODY = {"min_weight_version": -135453303929910784, "limit": 1000000.0}


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzzer_with_concurrent_reads_gets_no_5xx(tmp_path: Path) -> None:
    store = ChdbStore(tmp_path / "chdb")
    store.migrate()
    with BackgroundGateway(tmp_path / "gw", episode_wait_s=0.01, pause_hold_s=0.05) as gw:
        recorder = Recorder(gw.h.bus, store, max_wait_s=0.05)
        gw.run(recorder.start())
        gw.h.app.include_router(create_eventlog_router(store, "test-admin"))
        _, key = gw.h.keystore.create("fuzz")
        stop = threading.Event()
        answered: list[str] = []
        paused: list[int] = []
        read_statuses: list[int] = []
        errors: list[str] = []

        def agent() -> None:
            with openai.OpenAI(
                base_url=gw.episode_url(gw.open_episode()), api_key="x", max_retries=0
            ) as client:
                _calls(client)

        def _calls(client: openai.OpenAI) -> None:
            while not stop.is_set():
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                    answered.append(raw.headers["x-flywheel-call"])
                except openai.APIStatusError as exc:
                    if exc.status_code != 503:  # 503: the fuzzer paused the gateway; an agent retries
                        errors.append(f"agent: {exc!r}"[:200])
                        return
                    paused.append(1)
                    stop.wait(0.05)
                except openai.OpenAIError as exc:
                    errors.append(f"agent: {exc!r}"[:200])
                    return

        def reader() -> None:
            bodies = [FUZZ_BODY, {"limit": 1000}]
            with httpx.Client(timeout=60, headers=ADMIN) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    r = c.post(f"{gw.url}/admin/eventlog/episodes", json=bodies[i % 2])
                    read_statuses.append(r.status_code)
                    r = c.post(
                        f"{gw.url}/admin/eventlog/query", json={"sql": "SELECT count() FROM flywheel.events"}
                    )
                    read_statuses.append(r.status_code)

        # one of each: this runs on a small shared CI machine, and the point is concurrency, not load
        threads = [threading.Thread(target=agent), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        fuzzed: list[int] = []
        fuzzed_paths: set[str] = set()
        started = time.monotonic()
        try:
            schema = schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
            ep = gw.open_episode()
            auth: dict[str, str] = {}
            for result in schema.get_all_operations():
                op = result.ok()
                fuzzed_paths.add(op.path)
                auth.clear()
                auth.update(ADMIN if op.path.startswith("/admin") else {"Authorization": f"Bearer {key}"})

                @settings(
                    max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None
                )
                @given(case=op.as_strategy())
                def check(case) -> None:  # type: ignore[no-untyped-def]
                    if (
                        case.path_parameters
                        and "episode_id" in case.path_parameters
                        and hash(str(case.body)) % 2
                    ):
                        case.path_parameters["episode_id"] = ep
                    response = case.call(base_url=gw.url, headers=auth, timeout=30)
                    fuzzed.append(response.status_code)
                    case.validate_response(response, checks=[not_a_server_error])

                check()
            with httpx.Client(timeout=5) as c:
                assert c.get(f"{gw.url}/healthz").status_code == 200
        finally:
            stop.set()
            for t in threads:
                t.join(60)

            async def read_to_end() -> bool:  # the calls answered last are on the bus, maybe not read yet
                return await gw.h.bus.lag(EPISODES, RECORDER_GROUP) == 0

            gw.run(wait_until(read_to_end, 30, "the recorder at the end of the topic"), within_s=40)
            gw.run(recorder.stop())
        fuzz_s = time.monotonic() - started
        recorded = store.query(
            "SELECT JSONExtractString(payload, 'call_id') FROM flywheel.events FINAL"
            " WHERE type = 'llm_call_recorded'",
            max_rows=1_000_000,
        )
    store.close()
    recorded_ids = [row[0] for row in recorded.rows]
    lost = set(answered) - set(recorded_ids)
    figures = Figures(
        "fuzz_with_reads",
        calls=len(answered),
        ok=len(answered),
        lost=len(lost),
        duplicates=len(recorded_ids) - len(set(recorded_ids)),
        server_errors=sum(1 for code in [*fuzzed, *read_statuses] if code >= 500 and code not in (503, 504)),
        extra={
            "paused_503": len(paused),
            "fuzzed_requests": len(fuzzed),
            "reads": len(read_statuses),
            "fuzz_s": round(fuzz_s, 1),
        },
    )
    figures.report()
    assert not errors, errors[:3]
    assert figures.server_errors == 0 and not lost and figures.duplicates == 0, figures
    assert len(fuzzed) >= 40 and answered
    # every agent protocol's routes, the Responses and Messages APIs' included
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert {path, f"/episodes/{{episode_id}}{path}"} <= fuzzed_paths, sorted(fuzzed_paths)
