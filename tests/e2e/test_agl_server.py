"""``flywheel agl-server`` as an Agent Lightning user runs it: a real process, the real ``openai`` SDK
through its proxy, AGL's HTTP API, then a SIGKILL and a restart on the same data dir.

What AGL itself runs against it is in ``tests/compat/test_agl_server_suite.py``; here, what AGL does
not have: nothing acknowledged is lost across a killed process, every change is in the event log,
streaming works, paused calls can be held and admitted (``--pause-hold-s``), tenants are apart, bad
input is a 4xx. And what AGL 1.0.2 has, read from its ``server/proxy.py`` and ``routes/proxy.py``: the
pause answers at once and a paused call gets its 429 at once; the upstream gets exactly the body AGL's
proxy sends in train and val mode.
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


def _timed(send: Any) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = send()
    return r, time.monotonic() - t0


def test_pause_answers_at_once_and_paused_calls_get_agls_429_until_resume(
    tmp_path: Path, upstream: BackgroundUpstream
) -> None:
    """AGL's ``/proxy/pause`` contract with the server's defaults: the pause is answered at once with the
    in-flight count, whatever is in flight; while paused every proxied call gets 429 at once (before
    anything is sent upstream, streamed or not, either mode); ``/proxy/resume`` lets calls through."""
    server = Server(tmp_path / "data", upstream.url).start()
    c = httpx.Client(base_url=server.url, headers=H, timeout=60)
    msgs = [{"role": "user", "content": "hi"}]
    paused = {"error": "gateway paused", "reason": "weight sync"}
    try:
        c.post("/api/rollouts", json=[{"rollout_id": "p1", "input": {"q": 1}}]).raise_for_status()
        r, took = _timed(
            lambda: c.post("/proxy/pause", json={"retry_after_seconds": 3, "reason": "weight sync"})
        )
        assert r.status_code == 200 and took < 2, (r.status_code, took)
        assert r.json() == {"paused": True, "retry_after_seconds": 3, "reason": "weight sync", "inflight": 0}
        sent = len(upstream.config.requests)
        calls = [("chat/completions", {"messages": msgs}), ("completions", {"prompt": "1+1="}),
                 ("chat/completions", {"messages": msgs, "stream": True})]  # fmt: skip
        for mode in ("train", "val"):
            for path, body in calls:
                url = f"/proxy/rollout/p1/attempt/0/mode/{mode}/openai/v1/{path}"
                r, took = _timed(lambda url=url, body=body: c.post(url, json=body))
                assert r.status_code == 429 and took < 2, (mode, path, r.status_code, took)
                assert r.headers["retry-after"] == "3" and r.headers["x-agl-paused"] == "true"
                assert r.json() == paused
        assert len(upstream.config.requests) == sent  # nothing reached the upstream
        # what AGL's SWE agent retries on (examples/swe_smith: status 429 and "gateway paused" in the text)
        with pytest.raises(openai.RateLimitError) as refused:
            _agent(server, "p1").chat.completions.create(model="x", messages=msgs)  # type: ignore[arg-type]
        assert refused.value.status_code == 429 and "gateway paused" in refused.value.message.lower()
        r = c.post("/proxy/resume")
        assert r.json() == {"paused": False, "retry_after_seconds": 3, "reason": None, "inflight": 0}
        answer = _agent(server, "p1").chat.completions.create(model="x", messages=msgs)  # type: ignore[arg-type]
        assert answer.choices[0].message.content == "The answer is 42."

        # paused with a call in flight: answered at once with the count; the call finishes, new ones get 429
        upstream.config.latency_s = 3.0
        result: dict[str, httpx.Response] = {}
        proxy = "/proxy/rollout/p1/attempt/0/mode/train/openai/v1/chat/completions"
        slow = threading.Thread(target=lambda: result.setdefault("r", c.post(proxy, json={"messages": msgs})))
        slow.start()
        deadline = time.monotonic() + 10
        while c.get("/proxy/state").json()["inflight"] != 1:
            assert time.monotonic() < deadline, "the slow call never counted in flight"
            time.sleep(0.02)
        r, took = _timed(lambda: c.post("/proxy/pause", json={"retry_after_seconds": 4}))
        assert r.status_code == 200 and took < 2, (r.status_code, took)
        assert r.json() == {"paused": True, "retry_after_seconds": 4, "reason": None, "inflight": 1}
        r, took = _timed(lambda: c.post(proxy, json={"messages": msgs}))
        assert r.status_code == 429 and took < 2 and r.headers["retry-after"] == "4"
        assert r.json() == {"error": "gateway paused", "reason": None}
        slow.join(20)
        assert result["r"].status_code == 200, result["r"].text
        assert c.get("/proxy/state").json()["inflight"] == 0
        upstream.config.latency_s = 0.0
        assert c.post("/proxy/resume").json()["paused"] is False
        assert c.post(proxy, json={"messages": msgs}).status_code == 200
    finally:
        c.close()
        assert server.stop() == 0
    log = server.log.read_text()
    assert "Traceback" not in log and "agl.unhandled" not in log, log[-3000:]


def _forced(model: str, temperature: float, logprobs: bool) -> dict[str, Any]:
    """What AGL's ``ProxyRouter.prepare_body`` writes over the agent's body."""
    forced: dict[str, Any] = {"model": model, "temperature": temperature, "return_token_ids": True}
    return {**forced, "logprobs": True} if logprobs else forced


def test_the_upstream_gets_agls_body_in_train_and_val_mode(
    tmp_path: Path, upstream: BackgroundUpstream
) -> None:
    """The request the upstream receives is the agent's body with AGL's forced fields and nothing else:
    train → the train temperature, ``return_token_ids`` and ``logprobs: true``; val → the val temperature
    and ``return_token_ids``, no logprobs (an agent's own ``logprobs`` passes through, as in AGL)."""
    msgs = [{"role": "user", "content": "hi"}]
    bodies = {"chat/completions": {"messages": msgs, "max_tokens": 8},
              "completions": {"prompt": "1+1=", "max_tokens": 8}}  # fmt: skip
    server = Server(
        tmp_path / "data", upstream.url, "--train-temperature", "0.8", "--val-temperature", "0"
    ).start()
    c = httpx.Client(base_url=server.url, headers=H, timeout=60)
    try:
        c.post("/api/rollouts", json=[{"rollout_id": "f1", "input": {"q": 1}}]).raise_for_status()
        for mode, temperature in (("train", 0.8), ("val", 0.0)):
            for path, body in bodies.items():
                agent = {**body, "model": "agent-model", "temperature": 0.9, "top_p": 0.95}
                r = c.post(f"/proxy/rollout/f1/attempt/0/mode/{mode}/openai/v1/{path}", json=agent)
                assert r.status_code == 200, r.text
                sent = upstream.config.requests[-1]
                assert sent == {**agent, **_forced("policy-7b", temperature, mode == "train")}, (mode, path)
                choice = r.json()["choices"][0]
                assert choice["token_ids"]  # AGL still asks for the ids in val mode
                assert (choice["logprobs"] is not None) == (mode == "train"), (mode, path, choice)
        # an agent's own logprobs pass through in val mode (AGL's prepared body is {**body, ...})
        agent = {"messages": msgs, "logprobs": True, "top_logprobs": 2, "temperature": 0.9}
        r = c.post("/proxy/rollout/f1/attempt/0/mode/val/openai/v1/chat/completions", json=agent)
        assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is not None
        assert upstream.config.requests[-1] == {**agent, **_forced("policy-7b", 0.0, False)}
    finally:
        c.close()
        assert server.stop() == 0
    # AGL's include_log_probs: False → train mode asks none either
    server = Server(tmp_path / "data2", upstream.url, "--no-logprobs").start()
    c = httpx.Client(base_url=server.url, headers=H, timeout=60)
    try:
        c.post("/api/rollouts", json=[{"rollout_id": "f2", "input": {"q": 1}}]).raise_for_status()
        for path, body in bodies.items():
            r = c.post(f"/proxy/rollout/f2/attempt/0/mode/train/openai/v1/{path}", json=body)
            assert r.status_code == 200, r.text
            assert upstream.config.requests[-1] == {**body, **_forced("policy-7b", 1.0, False)}, path
    finally:
        c.close()
        assert server.stop() == 0
