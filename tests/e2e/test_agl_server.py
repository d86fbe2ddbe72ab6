"""``flywheel agl-server`` as an Agent Lightning user runs it: a real process, the real ``openai`` SDK
through its proxy, AGL's HTTP API, then a SIGKILL and a restart on the same data dir.

What AGL itself runs against it is in ``tests/compat/test_agl_server_suite.py``; here, what AGL does
not have: nothing acknowledged is lost across a killed process, every change is in the event log,
streaming works, paused calls are held and admitted, tenants are apart, bad input is a 4xx.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream import BackgroundUpstream, FakeUpstreamConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
REPO = Path(__file__).resolve().parents[2]
KEY = "agl-e2e-key"
ADMIN = "agl-e2e-admin"
H = {"Authorization": f"Bearer {KEY}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, upstream: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir, self.upstream, self.extra, self.more_env = data_dir, upstream, extra, env or {}
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"agl-{self.port}.log"

    def start(self) -> Server:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "HTTP_PROXY", "http_proxy"))
        }
        env.update(PYTHONPATH=str(REPO), FLYWHEEL_DATA_DIR=str(self.data_dir), FLYWHEEL_ADMIN_TOKEN=ADMIN)
        env.update(FLYWHEEL_LOG_JSON="1", FLYWHEEL_RECORDER_MAX_WAIT_S="0.05", **self.more_env)
        argv = [FLYWHEEL, "agl-server", "--port", str(self.port), "--key", KEY, "--model", "policy-7b"]
        argv += ["--upstream", self.upstream, *self.extra]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"agl-server did not start: {self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


@pytest.fixture
def upstream() -> Iterator[BackgroundUpstream]:
    with BackgroundUpstream(FakeUpstreamConfig(use_tools=False)) as up:
        yield up


_CLIENTS: list[openai.OpenAI] = []


def _agent(server: Server, rid: str, aid: str = "0", mode: str = "train") -> openai.OpenAI:
    base = f"{server.url}/proxy/rollout/{rid}/attempt/{aid}/mode/{mode}/openai/v1"
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _snapshot(c: httpx.Client, rids: list[str]) -> dict[str, Any]:
    states = [("state_in", s) for s in ("queuing", "running", "succeeded", "failed")]
    out: dict[str, Any] = {
        "list": c.get("/api/rollouts", params=states).json(),
        "terminal": c.get("/api/rollouts/terminal").json(),
        "pause": c.get("/proxy/state").json(),
    }
    for rid in rids:
        out[rid] = {
            "detail": c.get(f"/api/rollouts/{rid}").json(),
            "events": c.get(f"/api/rollouts/{rid}/events").json(),
            "triplets": c.get(f"/api/rollouts/{rid}/events", params={"format": "triplet"}).json(),
        }
    return out


def _counts(server: Server) -> dict[str, int]:
    r = httpx.get(f"{server.url}/admin/eventlog/counts", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    by_type: dict[str, int] = r.json()["by_type"]
    return by_type


def _wait_counts(server: Server, want: dict[str, int], timeout_s: float = 30) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = _counts(server)
        if all(got.get(k, 0) >= v for k, v in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_state_survives_sigkill_and_everything_is_in_the_event_log(
    tmp_path: Path, upstream: BackgroundUpstream
) -> None:
    server = Server(tmp_path / "data", upstream.url).start()
    c = httpx.Client(base_url=server.url, headers=H, timeout=30)
    try:
        made = c.post("/api/rollouts", json=[{"rollout_id": "r-a", "input": {"data_id": "a", "q": "1+1"}},
                                             {"input": {"q": "2+2"}, "is_train": False}]).json()  # fmt: skip
        rids = [r["rollout_id"] for r in made]
        assert c.patch("/api/rollouts/r-a", json={"status": {"state": "running"}}).status_code == 200
        agent = _agent(server, "r-a")
        first = agent.chat.completions.create(model="anything", messages=[{"role": "user", "content": "hi"}])
        assert first.choices[0].message.content == "The answer is 42."
        raw = first.model_dump()
        assert raw["prompt_token_ids"] and raw["choices"][0]["token_ids"]  # vLLM's layout, to the agent
        assert first.usage is not None and first.usage.prompt_tokens == len(raw["prompt_token_ids"])
        sent = upstream.config.requests[-1]
        assert sent["model"] == "policy-7b" and sent["temperature"] == 1.0 and sent["logprobs"] is True
        # streaming works (AGL: 400), and is recorded with its ids
        chunks = list(
            agent.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        assert (
            "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "The answer is 42."
        )
        val = _agent(server, rids[1], mode="val").completions.create(model="x", prompt="2+2=")
        assert val.choices[0].text
        assert upstream.config.requests[-1]["temperature"] == 0.7
        c.post("/api/rollouts/r-a/attempt/0/events", json={"event_type": "reward", "data": {"value": 1.0}})
        c.post("/api/rollouts/r-a/attempt/0/events", json={"event_type": "note", "data": {"text": "kept"}})
        assert c.patch("/api/rollouts/r-a", json={"status": {"state": "succeeded"}}).status_code == 200
        assert (
            c.post(
                "/api/models", json=[{"model": "other", "endpoint": "http://h/v1", "version": 2}]
            ).status_code
            == 201
        )
        assert c.post("/proxy/pause", json={"retry_after_seconds": 7, "reason": "sync"}).json()["paused"]
        triplets = c.get("/api/rollouts/r-a/events", params={"format": "triplet"}).json()
        requests = [t for t in triplets if t["event_type"] == "model_request"]
        assert len(requests) == 1  # the streamed call repeats the first prompt: the last one is kept
        assert requests[0]["data"]["response_token_ids"] and requests[0]["data"]["response_log_probs"]
        before = _snapshot(c, rids)
        # every change reached the event log through the bus (AglRecorded), with Flywheel's own events
        want = {"agl_recorded": 8, "llm_call_recorded": 3, "episode_started": 2, "reward_reported": 1,
                "episode_finished": 1}  # fmt: skip
        logged = _wait_counts(server, want)
        assert all(logged.get(k, 0) >= v for k, v in want.items()), logged
        # one more change, answered, then the process is killed at once
        c.post(
            f"/api/rollouts/{rids[1]}/attempt/0/events", json={"event_type": "reward", "data": {"value": 0.0}}
        )
        before = _snapshot(c, rids)
    finally:
        c.close()
        server.stop(signal.SIGKILL)

    again = Server(tmp_path / "data", upstream.url).start()
    c = httpx.Client(base_url=again.url, headers=H, timeout=30)
    try:
        after = _snapshot(c, rids)
        assert after == before
        assert after["pause"]["paused"] and after["pause"]["retry_after_seconds"] == 7
        assert c.post("/proxy/resume").json()["paused"] is False
        # the attempt goes on after the restart: its calls keep counting from where they were
        _agent(again, "r-a").chat.completions.create(
            model="x", messages=[{"role": "user", "content": "more"}]
        )
        events = c.get("/api/rollouts/r-a/events", params={"event_type": "model_request"}).json()
        assert len(events) == 3
        want = {"llm_call_recorded": 4, "agl_recorded": 10}
        logged = _wait_counts(again, want)
        assert all(logged.get(k, 0) >= v for k, v in want.items()), logged
    finally:
        c.close()
        assert again.stop() == 0, again.log.read_text()[-2000:]
    assert "Traceback" not in again.log.read_text()


def test_bad_input_is_a_4xx_and_keys_are_tenants(tmp_path: Path, upstream: BackgroundUpstream) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLYWHEEL_DATA_DIR": str(tmp_path / "data")}
    made = subprocess.run(
        [FLYWHEEL, "keys", "create", "--tenant", "acme"], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    acme = {"x-api-key": made.stdout.strip()}
    server = Server(tmp_path / "data", upstream.url, "--pause-hold-s", "5").start()
    c = httpx.Client(base_url=server.url, timeout=30)
    try:
        c.post("/api/rollouts", json=[{"rollout_id": "r1", "input": 1}], headers=H).raise_for_status()
        proxy = "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
        routes = [("GET", "/api/rollouts?state_in=queuing"), ("POST", "/api/rollouts"), ("GET", "/api/rollouts/r1"),
                  ("PATCH", "/api/rollouts/r1"), ("DELETE", "/api/rollouts/r1"), ("POST", "/api/models"),
                  ("GET", "/api/rollouts/r1/events"), ("POST", "/api/rollouts/r1/attempt/0/events"),
                  ("POST", proxy), ("POST", "/proxy/pause"), ("GET", "/proxy/state"), ("DELETE", "/api/models")]  # fmt: skip
        for method, path in routes:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"x-api-key": "wrong"},
                {"Authorization": KEY},
            ):
                r = c.request(method, path, headers=headers, json=[])
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json() == {"detail": "Invalid or missing API key"}
        assert c.get("/healthz").status_code == 200
        # another tenant's key does not reach this tenant's rollout (and cannot pause it)
        assert c.get("/api/rollouts/r1", headers=acme).status_code == 404
        c.post("/proxy/pause", json={}, headers=acme)
        assert c.get("/proxy/state", headers=H).json()["paused"] is False
        c.post("/proxy/resume", headers=acme)
        cases: list[tuple[str, str, Any, int]] = [
            ("GET", "/api/rollouts/nope", None, 404),
            ("PATCH", "/api/rollouts/nope", {"status": {"state": "running"}}, 404),
            ("GET", "/api/rollouts/nope/events", None, 404),
            ("POST", "/api/rollouts/nope/attempt/0/events", {"event_type": "x"}, 404),
            ("POST", "/proxy/rollout/nope/attempt/0/mode/train/openai/v1/chat/completions", {}, 404),
            ("POST", "/proxy/rollout/r1/attempt/0/mode/eval/openai/v1/chat/completions", {}, 404),
            ("POST", "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/embeddings", {}, 404),
            ("POST", "/api/rollouts", {"input": 1}, 422),
            ("POST", "/api/rollouts", [{"no_input": 1, "is_train": "maybe"}], 422),
            ("GET", "/api/rollouts", None, 422),
            ("GET", "/api/rollouts?state_in=done", None, 422),
            ("PATCH", "/api/rollouts/r1", {"status": {"state": "succeeded"}}, 409),
            ("PATCH", "/api/rollouts/r1", {"status": {"cancel_requested": True}}, 422),
            ("POST", "/api/rollouts/r1/attempt/0/events", {"data": {}}, 422),
            ("POST", "/api/rollouts/r1/attempt/0/events", {"event_type": "x", "data": [1]}, 422),
            ("POST", "/api/models", [{"model": "m"}], 422),
            ("POST", "/proxy/pause", {"retry_after_seconds": "soon"}, 422),
            ("GET", "/api/rollouts/terminal?after=x", None, 422),
        ]
        for method, path, body, status in cases:
            r = c.request(method, path, headers=H, json=body)
            assert r.status_code == status, (method, path, r.status_code, r.text)
        for raw in (b"{not json", b"[1]", b'"s"'):
            r = c.post(proxy, headers={**H, "content-type": "application/json"}, content=raw)
            assert r.status_code == 400, r.text
        r = c.post("/api/rollouts", headers={**H, "content-type": "application/json"}, content=b"{oops")
        assert r.status_code == 422
        # what AGL accepts is accepted: a 10k-character rollout id, a NaN reward (kept, not scored)
        long_id = "x" * 10_000
        assert (
            c.post("/api/rollouts", headers=H, json=[{"rollout_id": long_id, "input": None}]).status_code
            == 201
        )
        nan = b'{"event_type": "reward", "data": {"value": NaN}}'
        r = c.post(
            f"/api/rollouts/{long_id}/attempt/0/events",
            headers={**H, "content-type": "application/json"},
            content=nan,
        )
        assert r.status_code == 200, r.text
        assert c.get(f"/api/rollouts/{long_id}", headers=H).json()["attempts"] == ["0"]
        # an upstream 4xx is relayed as it came, and recorded as an error
        upstream.config.fail_next = [400]
        r = c.post(proxy, headers=H, json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400
        triplet = c.get("/api/rollouts/r1/events", headers=H, params={"format": "triplet"}).json()
        assert triplet[-1]["data"]["http_status"] == 400 and triplet[-1]["data"]["status"] == "error"
        # paused: a call is held, then admitted on resume (not refused)
        c.post("/proxy/pause", headers=H, json={"reason": "weights"}).raise_for_status()
        result: dict[str, Any] = {}

        def call() -> None:
            result["r"] = c.post(proxy, headers=H, json={"messages": [{"role": "user", "content": "held"}]})

        t = threading.Thread(target=call)
        t.start()
        t.join(1.0)
        assert t.is_alive()  # held, not refused
        assert c.get("/proxy/state", headers=H).json()["inflight"] == 0  # held calls are not in flight
        c.post("/proxy/resume", headers=H).raise_for_status()
        t.join(10)
        assert result["r"].status_code == 200, result["r"].text
        # past the hold: AGL's answer
        c.post(
            "/proxy/pause", headers=H, json={"retry_after_seconds": 3, "reason": "long"}
        ).raise_for_status()
        r = c.post(proxy, headers=H, json={"messages": [{"role": "user", "content": "late"}]})
        assert (
            r.status_code == 429 and r.headers["retry-after"] == "3" and r.headers["x-agl-paused"] == "true"
        )
        assert r.json() == {"error": "gateway paused", "reason": "long"}
    finally:
        c.close()
        assert server.stop() == 0
    log = server.log.read_text()
    assert "Traceback" not in log and "agl.unhandled" not in log, log[-3000:]
    assert json.dumps(KEY) not in log


@pytest.mark.kafka
async def test_on_kafka_every_change_is_on_the_bus_and_a_restart_keeps_the_state(
    tmp_path: Path, upstream: BackgroundUpstream, kafka_bootstrap: str, topic_prefix: str
) -> None:
    from infra.bus.base import Message
    from infra.bus.kafka import KafkaBus
    from schemas import AGL, EPISODES, AglRecorded

    kafka = {
        "FLYWHEEL_BUS": "kafka",
        "FLYWHEEL_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "FLYWHEEL_TOPIC_PREFIX": topic_prefix,
    }
    server = Server(tmp_path / "data", upstream.url, env=kafka).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=H, timeout=30) as c:
            (await c.post("/api/rollouts", json=[{"rollout_id": "k1", "input": {"q": 1}}])).raise_for_status()
            base = f"{server.url}/proxy/rollout/k1/attempt/0/mode/train/openai/v1"
            async with openai.AsyncOpenAI(base_url=base, api_key=KEY) as agent:
                await agent.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
            event = {"event_type": "reward", "data": {"value": 1.0}}
            (await c.post("/api/rollouts/k1/attempt/0/events", json=event)).raise_for_status()
            before = (await c.get("/api/rollouts/k1/events")).json()
    finally:
        server.stop(signal.SIGKILL)
    seen: list[str] = []
    got = asyncio.Event()

    async def on(msg: Message) -> None:
        seen.append(msg.event.type)
        if {"agl_recorded", "llm_call_recorded", "reward_reported"} <= set(seen):
            got.set()

    bus = KafkaBus(kafka_bootstrap, prefix=topic_prefix)
    await bus.start()
    try:
        subs = [await bus.subscribe(t, "agl-e2e-check", on, from_beginning=True) for t in (AGL, EPISODES)]
        await asyncio.wait_for(got.wait(), 60)
        for sub in subs:
            await sub.stop()
    finally:
        await bus.stop()
    assert seen.count("agl_recorded") == 2 and AglRecorded  # the rollout and the reward event
    again = Server(tmp_path / "data", upstream.url, env=kafka).start()
    try:
        async with httpx.AsyncClient(base_url=again.url, headers=H, timeout=30) as c:
            assert (await c.get("/api/rollouts/k1/events")).json() == before
    finally:
        assert again.stop() == 0
