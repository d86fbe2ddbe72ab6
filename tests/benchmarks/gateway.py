"""Gateway overhead: added latency, throughput and streaming TTFT, against the real floor.

    python tests/benchmarks/gateway.py [--json] [--rounds 3] [--requests 1600] [--concurrency 32]

Every server runs in its own process on loopback, on the gateway's own stack (uvicorn + httptools on
uvloop):
- the upstream, as fast as it can be: the fake vLLM of tests/fakes/upstream.py behind a memo of its
  answers (FAKE). Calling it directly is the "direct" path;
- the floor: the fastest forwarder on the same stack, the gateway's server and its upstream client
  (gateway/upstream/wire.py), forwarding and recording nothing (FLOOR);
- the Flywheel gateway via `flywheel gateway`, on the in-process bus, on real Kafka with acks=all, and
  with httpx as its upstream client; and on the in-process bus with OpenTelemetry export on
  (`gateway_memory_otel`: FLYWHEEL_OTLP_ENDPOINT set, so the exporter consumes the gateway's events in
  the gateway's process and sends spans over OTLP/HTTP, batched by the SDK's BatchSpanProcessor). Its
  receiver is a minimal OTLP/HTTP sink on loopback in its own process (SINK: it decodes each export
  request, counts the spans and discards them), not Arize Phoenix: Phoenix ingests ~180 spans/s on two
  cores and a round sends thousands, so it would be busy on the CPUs every later target is measured on.
  After the target's figures, its gateway's recorded calls (its /metrics) are read, it is stopped
  (SIGTERM: the exporter flushes its queue) and the sink's count is read: ``spans_dropped`` = calls −
  call spans received (the SDK's queue drops what does not fit); LiteLLM's proxy and Agent Lightning's `agl-server` when they are
  installed (the peers a user would otherwise pick), and `flywheel agl-server` on AGL's route.
Two differences come out of it: added = target − direct (what an agent sees), and recording = gateway
− floor (what the gateway's own work costs, over the least any forwarder here costs). Both are ≥ 0 up
to noise: a proxy cannot beat the path it proxies.

Against the noise of shared CPUs: serial and open-loop figures take turns with the direct path in one
window (each request goes to the target or to direct in turn), so a difference is never between two
moments; the whole pass over every target runs ``--rounds`` times and each figure is the median of its
per-round values; one proxy runs at a time (no idle proxy's background work in another's figures).
``FLYWHEEL_BIN`` runs the gateway with another ``flywheel`` executable (default: the venv's own). The
load generator is this process, on gateway/upstream/wire.py's keep-alive client (~0.1 ms of CPU a request, where
httpx took ~1.5 ms and so queued its own requests).

Three regimes:
- open loop (the goals' added latency): `--concurrency` pooled client connections, Poisson arrivals at
  `--offered` × the direct path's closed-loop capacity, the same rate for every target; latency counts
  from each request's scheduled arrival. The proxy's own added latency at a load the machine carries.
- closed loop: `--concurrency` clients back to back. The load generator, the upstream and the proxy
  share the CPUs and saturate them, so its +p50/+p99 are mostly queueing; its req/s gives the
  throughput ratios (vs the floor, LiteLLM and AGL).
- serial: 1 client, the overhead without any queueing; the streaming TTFT overhead is serial too.
LiteLLM runs from its own venv (`FLYWHEEL_LITELLM`, default
~/.cache/flywheel/litellm-venv/bin/litellm) because its pins conflict with Flywheel's.
Agent Lightning 1.0.2's `agl-server` (target `agl`) runs from its own Python 3.12 venv
(`FLYWHEEL_AGL_SERVER`, default ~/.cache/flywheel/venv-agl/bin/agl-server, built by the compat tests,
``tests/compat/agl_env.py``): its proxy route for one rollout in train mode, the fake upstream
registered as its model server. `flywheel_agl` is `flywheel agl-server` on the same route (context:
it records into its journal and the event log, AGL's keeps a dict).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from statistics import quantiles
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # before this file's own folder, where "gateway" would be this script

from gateway.upstream.wire import WirePool  # noqa: E402 - needs the path above
from infra.kafka.launcher import BrokerConfig, read_pid  # noqa: E402 - needs the path above

PY = sys.executable
# the `flywheel` that serves the gateway (FLYWHEEL_BIN: another build of the CLI, to compare one with it)
FLYWHEEL = os.environ.get("FLYWHEEL_BIN", str(Path(PY).with_name("flywheel")))
LITELLM = os.environ.get("FLYWHEEL_LITELLM", str(Path.home() / ".cache/flywheel/litellm-venv/bin/litellm"))
AGL_SERVER = os.environ.get(
    "FLYWHEEL_AGL_SERVER",
    str(
        Path(os.environ.get("FLYWHEEL_AGL_ENV", Path.home() / ".cache/flywheel/venv-agl")) / "bin/agl-server"
    ),
)
KAFKA = os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
ADMIN = "bench-admin"
MASTER_KEY = "sk-" + uuid.uuid4().hex + uuid.uuid4().hex  # LiteLLM refuses weak keys; others ignore it
BODY = {"model": "policy", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 16}

# The upstream, as fast as it can be: the fake vLLM of tests/fakes/upstream.py behind a memo of its
# answers (it is deterministic: a request it has answered gets the same bytes again, without FastAPI
# or pydantic), on the gateway's own stack (uvicorn + httptools on uvloop). Calling it directly is the
# "direct" path every target is measured against.
FAKE = textwrap.dedent(
    """
    import asyncio, sys
    from infra.service import HttpServer, run
    from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream
    slow = create_fake_upstream(FakeUpstreamConfig(keep_requests=False, reply="4"))
    memo = {}
    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await slow(scope, receive, send)
        body, more = b"", True
        while more:
            m = await receive()
            body, more = body + m.get("body", b""), m.get("more_body", False)
        key = (scope["path"], body)
        sent = memo.get(key)
        if sent is None:
            sent = []
            given = []
            async def once():  # the body, then nothing (no disconnect) until the answer is sent
                if given:
                    await asyncio.Event().wait()
                given.append(1)
                return {"type": "http.request", "body": body, "more_body": False}
            async def keep(message):
                sent.append(message)
            await slow(scope, once, keep)
            if len(memo) < 4096:
                memo[key] = sent
        for message in sent:
            await send(message)
    async def main():
        await HttpServer(app, port=int(sys.argv[1])).start()
        await asyncio.Event().wait()
    run(main())
    """
)

# The floor: the fastest forwarder on the gateway's stack. The gateway's own server (GatewayServer:
# uvicorn with its protocol, httptools, on uvloop via infra.service.run) and its own upstream client
# (make_upstream's keep-alive pool, gateway/upstream/wire.py), forwarding each request and its answer as they
# are and recording nothing. The gateway minus this is what recording costs.
FLOOR = textwrap.dedent(
    """
    import asyncio, sys
    from gateway.server import GatewayServer
    from gateway.upstream.client import make_upstream
    from infra.service import run
    wire = make_upstream(sys.argv[2]).wire
    JSON = [(b"content-type", b"application/json")]
    SSE = [(b"content-type", b"text/event-stream")]
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 404, "headers": JSON})
            return await send({"type": "http.response.body", "body": b"{}"})
        body, more = b"", True
        while more:
            m = await receive()
            body, more = body + m.get("body", b""), m.get("more_body", False)
        stream = b'"stream":true' in body or b'"stream": true' in body
        r = await wire.post(scope["path"].removeprefix("/v1/"), body, stream=stream)
        await send({"type": "http.response.start", "status": r.status_code, "headers": SSE if stream else JSON})
        if stream:
            async for line in r.aiter_lines():
                await send({"type": "http.response.body", "body": line.encode() + b"\\n", "more_body": True})
            await r.aclose()
            return await send({"type": "http.response.body", "body": b""})
        await send({"type": "http.response.body", "body": r.content})
    async def main():
        await GatewayServer(app, port=int(sys.argv[1])).start()
        await asyncio.Event().wait()
    run(main())
    """
)


# The OTLP/HTTP receiver of the export target (gateway_memory_otel): accepts each export request on
# /v1/traces, decodes it (opentelemetry-proto, as a collector does), counts its spans and discards them;
# GET /count says how many arrived. Not Phoenix: Phoenix ingests ~180 spans/s on two cores
# (docs/observability.md), so the thousands of spans a round sends would keep it busy on the CPUs every
# later target is measured on; this sink's work is a protobuf parse per batch of up to 512 spans.
SINK = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)
    from infra.service import HttpServer, run
    seen = {"spans": 0, "requests": 0, "calls": 0}
    OK = ExportTraceServiceResponse().SerializeToString()
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            m = await receive()
            body, more = body + m.get("body", b""), m.get("more_body", False)
        if scope["method"] == "POST":
            export = ExportTraceServiceRequest.FromString(body)
            seen["requests"] += 1
            for rs in export.resource_spans:
                for ss in rs.scope_spans:
                    seen["spans"] += len(ss.spans)
                    seen["calls"] += sum(1 for s in ss.spans if s.name.startswith("chat "))
            out, kind = OK, b"application/x-protobuf"
        else:
            out, kind = json.dumps(seen).encode(), b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": out})
    async def main():
        await HttpServer(app, port=int(sys.argv[1])).start()
        await asyncio.Event().wait()
    run(main())
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_reachable() -> bool:
    host, _, port = KAFKA.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def local_broker_pid() -> int | None:
    """The pid of the broker behind ``KAFKA`` when `flywheel kafka start` runs it on this machine."""
    host, _, port = KAFKA.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        return None
    return read_pid(BrokerConfig(port=int(port)))


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - lives with the process
        self.p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()

    def cpu_s(self) -> float:
        return proc_cpu_s(self.p.pid)

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-1500:]


async def wait_http(url: str, proc: Proc, within_s: float = 90) -> None:
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient() as c:
        while True:
            try:
                r = await c.get(url, timeout=2)
                if r.status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if proc.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server at {url} did not start:\n{proc.tail()}")
            await asyncio.sleep(0.1)


def _client(url: str, headers: dict[str, str]) -> tuple[WirePool, str]:
    """A lean keep-alive HTTP/1.1 client for the load generator, and the path to POST to.

    The load generator uses gateway/upstream/wire.py (not httpx) so that its own CPU per request (~0.1 ms
    instead of ~1.5 ms) perturbs the shared CPUs as little as possible; it is the same for every target.
    """
    base, _, path = url.rpartition("/v1/")
    return WirePool(base + "/v1/", headers=headers, read_timeout_s=60), path


async def _post(pool: WirePool, path: str, body: bytes) -> bool:
    try:
        async with asyncio.timeout(60):
            r = await pool.post(path, body, stream=False)
    except (httpx.TransportError, TimeoutError):
        return False
    return r.status_code == 200


async def load(url: str, n: int, concurrency: int, headers: dict[str, str]) -> dict[str, float]:
    """Closed loop: ``concurrency`` clients, each sends its next request when the last one returned."""
    lat: list[float] = []
    failures = 0
    pool, path = _client(url, headers)
    body = orjson.dumps(BODY)

    async def one() -> None:
        nonlocal failures
        t = time.perf_counter()
        if await _post(pool, path, body):
            lat.append((time.perf_counter() - t) * 1000)
        else:
            failures += 1

    try:
        for _ in range(min(50, n)):  # warm-up: connections, caches
            await one()
        lat.clear()
        failures = 0
        queue = iter(range(n))

        async def worker() -> None:
            for _ in queue:
                await one()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    finally:
        await pool.aclose()
    if len(lat) < n * 0.9:
        raise RuntimeError(f"{failures} of {n} requests failed against {url}")
    q = quantiles(lat, n=100)
    return {"p50": q[49], "p99": q[98], "rps": len(lat) / elapsed, "failed": failures}


async def open_loop(
    urls: list[str], rate: float, duration_s: float, concurrency: int, headers: dict[str, str], seed: int = 7
) -> list[dict[str, float]]:
    """Poisson arrivals at ``rate`` req/s per url, taking turns, at most ``concurrency`` in flight per url.

    Interleaved, a target and the direct path share every moment of the window (the other work on
    these CPUs included), so their difference is the target's and not the noise's. Latency runs from
    each request's scheduled arrival, not from when a client was free, so a stalled target is charged
    for the requests that queue behind it (no coordinated omission).
    """
    rng = random.Random(seed)
    lat: list[list[float]] = [[] for _ in urls]
    failures = [0 for _ in urls]
    loop = asyncio.get_running_loop()
    clients = [_client(url, headers) for url in urls]
    body = orjson.dumps(BODY)
    slots = [asyncio.Semaphore(concurrency) for _ in urls]

    async def one(i: int, at: float) -> None:
        pool, path = clients[i]
        async with slots[i]:
            ok = await _post(pool, path, body)
        if ok:
            lat[i].append((loop.time() - at) * 1000)
        else:
            failures[i] += 1

    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.gather(*(one(i, loop.time()) for i in range(len(urls)) for _ in range(concurrency)))
        for i in range(len(urls)):  # the warm-up's connections stay; its figures do not
            lat[i].clear()
            failures[i] = 0
        start = at = loop.time()
        while at - start < duration_s:
            at += rng.expovariate(rate * len(urls))
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(len(tasks) % len(urls), at)))
        await asyncio.gather(*tasks)
    finally:
        for pool, _ in clients:
            await pool.aclose()
    out = []
    for i, url in enumerate(urls):
        sent = len(tasks[i :: len(urls)])
        if len(lat[i]) < sent * 0.9:
            raise RuntimeError(f"{failures[i]} of {sent} requests failed against {url}")
        q = quantiles(lat[i], n=100)
        out.append({"p50": q[49], "p99": q[98], "rate": sent / duration_s, "failed": failures[i]})
    return out


async def serial_pair(urls: list[str], n: int, headers: dict[str, str]) -> list[float]:
    """p50 of ``n`` requests per url, one at a time, taking turns (no queueing: the bare overhead)."""
    lat: list[list[float]] = [[] for _ in urls]
    clients = [_client(url, headers) for url in urls]
    body = orjson.dumps(BODY)
    try:
        for k in range(n + 10):  # 10 warm-up turns
            for i, (pool, path) in enumerate(clients):
                t = time.perf_counter()
                if not await _post(pool, path, body):
                    raise RuntimeError(f"a serial request failed against {urls[i]}")
                if k >= 10:
                    lat[i].append((time.perf_counter() - t) * 1000)
    finally:
        for pool, _ in clients:
            await pool.aclose()
    return [statistics.median(v) for v in lat]


async def ttft(urls: list[str], n: int, headers: dict[str, str]) -> list[float]:
    """p50 time to the first chunk that carries content, one streamed request at a time, taking turns."""
    body = orjson.dumps({**BODY, "stream": True, "max_tokens": 64})
    firsts: list[list[float]] = [[] for _ in urls]
    clients = [_client(url, headers) for url in urls]
    try:
        for k in range(n + 10):
            for i, (pool, path) in enumerate(clients):
                t = time.perf_counter()
                async with asyncio.timeout(60):
                    r = await pool.post(path, body, stream=True)
                    first = None
                    async for line in r.aiter_lines():
                        if (
                            first is None
                            and line.startswith("data: {")
                            and '"content":"' in line
                            and '"content":""' not in line
                        ):
                            first = (time.perf_counter() - t) * 1000
                    await r.aclose()
                if k >= 10 and first is not None:
                    firsts[i].append(first)
    finally:
        for pool, _ in clients:
            await pool.aclose()
    return [statistics.median(v) for v in firsts]


async def start_gateway(
    upstream: str, bus: str, data_dir: Path, *, prefix: str = "", extra: dict[str, str] | None = None
) -> tuple[Proc, str, str]:
    port = free_port()
    env = {
        **os.environ,
        "FLYWHEEL_BUS": bus,
        "FLYWHEEL_KAFKA_BOOTSTRAP": KAFKA,
        "FLYWHEEL_TOPIC_PREFIX": prefix or f"bench-{uuid.uuid4().hex[:8]}.",
        "FLYWHEEL_DATA_DIR": str(data_dir / bus),
        "FLYWHEEL_ADMIN_TOKEN": ADMIN,
        "FLYWHEEL_GATEWAY_PORT": str(port),
        "FLYWHEEL_LOG_LEVEL": "WARNING",
        "FLYWHEEL_EPISODES_FROM_BEGINNING": "false",
        **(extra or {}),
    }
    proc = Proc([FLYWHEEL, "gateway", "--upstream", upstream], env)
    base = f"http://127.0.0.1:{port}"
    await wait_http(f"{base}/readyz", proc)
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{base}/admin/episodes", headers={"Authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
    return proc, f"{r.json()['base_url']}/chat/completions", base


ADMISSIONS = ("topic", "ticket")


async def idle_gateway(
    upstream: str, data_dir: Path, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Two gateways on one broker and one topic prefix: one loaded, one idle. What the idle one spends.

    ``topic``: gateways learn episodes from flywheel.episodes, so the idle one reads every call the
    loaded one records; ``ticket``: both hold FLYWHEEL_EPISODE_KEY and admit signed episode URLs,
    reading nothing of that topic. Per mode: the idle gateway's CPU per second with no traffic at all
    (its consumers polling the broker), then during a closed-loop load on the other gateway; what the
    load adds to the idle one, per call served by the loaded one.
    """
    out: dict[str, dict[str, float]] = {}
    for mode in ADMISSIONS:
        prefix = f"bench-idle-{uuid.uuid4().hex[:8]}."
        extra = {"FLYWHEEL_EPISODE_KEY": "bench-episode-key-" + uuid.uuid4().hex} if mode == "ticket" else {}
        procs: list[Proc] = []
        try:
            loaded, url, _ = await start_gateway(
                upstream, "kafka", data_dir / f"{mode}-loaded", prefix=prefix, extra=extra
            )
            procs.append(loaded)
            idle, _, _ = await start_gateway(
                upstream, "kafka", data_dir / f"{mode}-idle", prefix=prefix, extra=extra
            )
            procs.append(idle)
            await asyncio.sleep(2.0)  # both consumers joined and settled
            cpu0, t0 = idle.cpu_s(), time.perf_counter()
            await asyncio.sleep(args.duration)
            quiet_rate = (idle.cpu_s() - cpu0) / (time.perf_counter() - t0)  # CPU s per s
            idle0, loaded0, t0 = idle.cpu_s(), loaded.cpu_s(), time.perf_counter()
            row = await load(url, args.requests, args.concurrency, {})
            await asyncio.sleep(1.0)  # what the idle one still has to read of the load
            elapsed = time.perf_counter() - t0
            calls = args.requests + min(50, args.requests)  # + warm-up
            idle_cpu = idle.cpu_s() - idle0
            out[mode] = {
                "quiet_cpu_ms_per_s": quiet_rate * 1000,
                "loaded_cpu_ms_per_s": idle_cpu * 1000 / elapsed,
                "added_cpu_ms_per_call": max(0.0, idle_cpu - quiet_rate * elapsed) * 1000 / calls,
                "loaded_gateway_cpu_ms_per_call": (loaded.cpu_s() - loaded0) * 1000 / calls,
                "rps": row["rps"],
            }
        finally:
            for proc in procs:
                proc.stop()
    return out


async def start_litellm(upstream: str, data_dir: Path) -> tuple[Proc | None, str, str]:
    if not Path(LITELLM).exists():  # noqa: ASYNC240 - once, at start-up
        return None, "", f"not installed ({LITELLM})"
    port = free_port()
    cfg = data_dir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: policy\n    litellm_params:\n"
        f"      model: openai/fake-model\n      api_base: {upstream}\n      api_key: sk-fake\n"
    )
    env = {
        **os.environ,
        "LITELLM_LOG": "INFO",
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    proc = Proc([LITELLM, "--config", str(cfg), "--port", str(port), "--host", "127.0.0.1"], env)
    try:
        await wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, within_s=120)
    except RuntimeError as exc:
        proc.stop()
        return None, "", f"did not start: {str(exc).splitlines()[-1][:120]}"
    return proc, f"http://127.0.0.1:{port}/v1/chat/completions", ""


async def start_agl(name: str, upstream: str, data_dir: Path) -> tuple[Proc, str]:
    """AGL's ``agl-server`` (``agl``) or ``flywheel agl-server`` (``flywheel_agl``), one rollout open."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if name == "agl":
        if not Path(AGL_SERVER).exists():  # noqa: ASYNC240 - once, at start-up
            raise RuntimeError(f"unavailable, not installed ({AGL_SERVER}; the compat tests build it)")
        argv = [AGL_SERVER, "host=127.0.0.1", f"port={port}", f"key={MASTER_KEY}"]
        argv += ["default_proxy.model_name=policy", f"hydra.run.dir={data_dir / 'agl-hydra'}"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    else:
        argv = [FLYWHEEL, "agl-server", "--port", str(port), "--key", MASTER_KEY, "--model", "policy"]
        argv += ["--upstream", upstream]
        env = {**os.environ, "FLYWHEEL_DATA_DIR": str(data_dir / name), "FLYWHEEL_LOG_LEVEL": "WARNING"}
    proc = Proc(argv, env)
    await wait_http(f"{base}/healthz", proc, within_s=120)
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=headers) as c:
        if name == "agl":
            (await c.post("/api/models", json=[{"model": "policy", "endpoint": upstream}])).raise_for_status()
        r = await c.post("/api/rollouts", json=[{"input": {"q": "bench"}}])
        r.raise_for_status()
        rid = r.json()[0]["rollout_id"]
    return proc, f"{base}/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions"


async def _start_target(name: str, upstream: str, data_dir: Path) -> tuple[Proc, str]:
    """Start one proxy under test; raises RuntimeError (with why) when it cannot run here."""
    if name == "floor":
        port = free_port()
        proc = Proc([PY, "-c", FLOOR, str(port), upstream])
        await wait_http(f"http://127.0.0.1:{port}/", proc)
        return proc, f"http://127.0.0.1:{port}/v1/chat/completions"
    if name in ("gateway_memory", "gateway_kafka", "gateway_memory_httpx"):
        bus = name.removeprefix("gateway_").removesuffix("_httpx")
        if bus == "kafka" and not kafka_reachable():
            raise RuntimeError(f"skipped, no broker at {KAFKA}")
        client = {"FLYWHEEL_UPSTREAM_CLIENT": "httpx" if name.endswith("_httpx") else "wire"}
        proc, url, _ = await start_gateway(upstream, bus, data_dir / name, extra=client)
        return proc, url
    if name == "gateway_memory_otel":
        port = free_port()
        sink = Proc([PY, "-c", SINK, str(port)])
        await wait_http(f"http://127.0.0.1:{port}/count", sink)
        extra = {"FLYWHEEL_UPSTREAM_CLIENT": "wire", "FLYWHEEL_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        try:
            proc, url, base = await start_gateway(upstream, "memory", data_dir / name, extra=extra)
        except RuntimeError:
            sink.stop()
            raise
        EXPORTS[url] = (sink, f"http://127.0.0.1:{port}/count", base)
        return proc, url
    if name in ("agl", "flywheel_agl"):
        return await start_agl(name, upstream, data_dir)
    lp, lurl, why = await start_litellm(upstream, data_dir)
    if lp is None:
        raise RuntimeError(f"unavailable, {why}")
    return lp, lurl


# gateway_memory_otel's receiver, by the target's URL: (the sink, its /count URL, the gateway's base URL)
EXPORTS: dict[str, tuple[Proc, str, str]] = {}


async def export_counts(url: str, gateway: Proc) -> dict[str, float]:
    """After the export target's measurement: the calls its gateway recorded (its /metrics), then, once
    SIGTERM has stopped it (the exporter flushes its queue on the way out), the spans the sink received."""
    sink, count_url, base = EXPORTS.pop(url)
    try:
        async with httpx.AsyncClient() as c:
            text = (
                await c.get(f"{base}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
            ).text
            calls = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("flywheel_gateway_calls_total{")
            )
            gateway.stop()
            got = (await c.get(count_url, timeout=10)).json()
    finally:
        sink.stop()
    return {
        "calls": calls,
        "spans": float(got["calls"]),
        "all_spans": float(got["spans"]),
        "export_requests": float(got["requests"]),
        "dropped": calls - float(got["calls"]),
    }


async def _measure(
    name: str,
    url: str,
    direct: str,
    proc: Proc,
    args: argparse.Namespace,
    rates: dict[float, float],
) -> tuple[dict[str, float], dict[str, float], dict[float, dict[str, float]], list[str]]:
    """One target's serial, closed-loop and open-loop figures (open loop at every rate it can carry).

    Serial and open loop take turns with the direct path (``direct_p50`` / ``direct_p99``: its figures
    of the same window). ``rates``: offered rate (req/s) per fraction of the direct path's capacity;
    empty for the direct path itself, which is measured first and fills it from its own closed loop.
    """
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
    n, c = args.requests, args.concurrency
    notes: list[str] = []
    urls = [url] if url == direct else [url, direct]
    s = await serial_pair(urls, args.serial, headers)
    serial = {"p50": s[0], "direct_p50": s[-1]}
    cpu0 = proc.cpu_s()
    row = await load(url, n, c, headers)
    # CPU the proxy process spent per call: its share of the added latency that does not depend on how
    # busy the machine is (the upstream's own CPU is in "direct")
    row["cpu_ms"] = (proc.cpu_s() - cpu0) * 1000 / (n + min(50, n))  # + warm-up
    if not rates:
        rates.update({frac: frac * row["rps"] for frac in sorted({args.offered, *args.sweep})})
    broker = local_broker_pid() if kafka_reachable() else None  # its idle work: direct's figure
    opened: dict[float, dict[str, float]] = {}
    for frac, rate in rates.items():
        if row["rps"] * 0.9 < rate:  # at or past its own capacity: the queue only grows
            notes.append(
                f"{name}: no open-loop figure at {frac:.2f}, its capacity ({row['rps']:.0f} req/s) is"
                f" below {rate:.0f} req/s / 0.9"
            )
            continue
        cpu0 = proc.cpu_s()
        broker0 = proc_cpu_s(broker) if broker is not None else 0.0
        both = await open_loop(urls, rate, args.duration, c, headers)
        opened[frac] = o = {**both[0], "direct_p50": both[-1]["p50"], "direct_p99": both[-1]["p99"]}
        calls = o["rate"] * args.duration + c  # + the warm-up round
        # CPU a call at this offered rate (small produce batches, one fetch per call or so): the proxy's
        # own, and the broker's, which shares these CPUs and so queues the proxy's work
        o["cpu_ms"] = (proc.cpu_s() - cpu0) * 1000 / calls
        if broker is not None:
            o["broker_cpu_ms"] = (proc_cpu_s(broker) - broker0) * 1000 / calls
    return serial, row, opened, notes


TARGETS = (
    "floor",  # the fastest forwarder on the gateway's stack, recording nothing (FLOOR)
    "gateway_memory",
    "gateway_memory_otel",  # the same, with OpenTelemetry export on in its process (to SINK)
    "gateway_kafka",
    "gateway_memory_httpx",  # the same gateway with httpx to the upstream: what gateway/upstream/wire.py buys
    "litellm",
    "agl",
    "flywheel_agl",
    "idle_gateway",  # two gateways on one broker, one loaded (see idle_gateway); not a proxy
)


Round = dict[str, Any]  # one pass over every target: rows, serial, sweep, ttfts


async def _round(
    upstream: str, fake: Proc, data_dir: Path, args: argparse.Namespace, rates: dict[float, float]
) -> Round:
    """Direct, then every target, each started, measured and stopped before the next."""
    rows: dict[str, dict[str, float]] = {}
    serial: dict[str, dict[str, float]] = {}
    sweep: dict[float, dict[str, dict[str, float]]] = {}
    ttfts: dict[str, dict[str, float]] = {}
    exports: dict[str, dict[str, float]] = {}  # the export target's calls and the spans its sink received
    notes: list[str] = []
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
    direct = f"{upstream}/chat/completions"
    for name in ("direct", *(t for t in TARGETS if t in args.targets and t != "idle_gateway")):
        proc: Proc | None = None
        try:
            if name == "direct":
                proc, url = fake, direct
            else:
                proc, url = await _start_target(name, upstream, data_dir)
            serial[name], rows[name], runs, more = await _measure(name, url, direct, proc, args, rates)
            notes.extend(more)
            for frac, o in runs.items():
                sweep.setdefault(frac, {})[name] = o
            if name in ("direct", "floor", "gateway_memory", "gateway_memory_otel"):
                t = await ttft([url] if url == direct else [url, direct], args.stream, headers)
                ttfts[name] = {"p50": t[0], "direct_p50": t[-1]}
            if url in EXPORTS:
                exports[name] = await export_counts(url, proc)
        except RuntimeError as exc:
            if name in ("direct", "floor", "gateway_memory"):
                raise
            notes.append(f"{name}: {str(exc)[-200:]}")
            rows.pop(name, None)
            serial.pop(name, None)
        finally:
            if proc is not None and proc is not fake:
                proc.stop()
            for sink, _, _ in EXPORTS.values():  # a target that failed before its counts were read
                sink.stop()
            EXPORTS.clear()
    return {
        "rows": rows,
        "serial": serial,
        "sweep": sweep,
        "ttfts": ttfts,
        "notes": notes,
        "exports": exports,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """``args.rounds`` passes over every target; each figure is the median of its per-round values.

    Within a round each proxy runs alone with the upstream: started, measured, stopped before the next.
    An idle proxy beside the one measured is not part of that proxy's latency; an idle Kafka consumer
    alone polls its broker (both on these CPUs), and LiteLLM runs background loops.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    rates: dict[float, float] = {}  # fixed by the first round's direct capacity, the same in every round
    rounds: list[Round] = []
    up_port = free_port()
    fake = Proc([PY, "-c", FAKE, str(up_port)])
    idle: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    try:
        upstream = f"http://127.0.0.1:{up_port}/v1"
        await wait_http(f"{upstream}/models", fake)
        for i in range(args.rounds):
            rounds.append(await _round(upstream, fake, data_dir, args, rates))
            notes.extend(f"round {i + 1}: {n}" for n in rounds[-1]["notes"])
        if "idle_gateway" in args.targets:
            if kafka_reachable():
                idle = await idle_gateway(upstream, data_dir, args)
            else:
                notes.append(f"idle_gateway: skipped, no broker at {KAFKA}")
    finally:
        fake.stop()
    figures = median_figures([_figures(r, args.offered) for r in rounds])
    for mode, r in idle.items():  # the idle gateway beside a loaded one (measured once, not a ratio)
        for key, value in r.items():
            figures[f"idle_gateway_{mode}_{key}"] = value
    if len(idle) == 2 and idle["topic"]["added_cpu_ms_per_call"] > 0:
        figures["idle_gateway_added_cpu_ticket_vs_topic"] = (
            idle["ticket"]["added_cpu_ms_per_call"] / idle["topic"]["added_cpu_ms_per_call"]
        )
    figures["rounds"] = float(len(rounds))
    last = rounds[-1]
    return {
        "figures": figures,
        "goals": GOALS,
        "rows": last["rows"],
        "serial": last["serial"],
        "opened": last["sweep"][args.offered],
        "sweep": last["sweep"],
        "notes": notes,
    }


# Added latency is against the direct path (what an agent sees); recording is against the floor (what
# the gateway's own work costs, over the least any forwarder on its stack costs).
GOALS = {
    "gateway_memory_added_p50_ms": "≤ 1",
    "gateway_memory_added_p99_ms": "≤ 5",
    "gateway_memory_recording_p50_ms": "≤ 0.5",
    "gateway_memory_serial_recording_p50_ms": "≤ 0.5",
    # the same gateway with OpenTelemetry export on in its process (gateway_memory_otel): the same goals
    "gateway_memory_otel_added_p50_ms": "≤ 1",
    "gateway_memory_otel_added_p99_ms": "≤ 5",
    "gateway_memory_otel_recording_p50_ms": "≤ 0.5",
    "gateway_memory_otel_serial_recording_p50_ms": "≤ 0.5",
    "gateway_memory_otel_throughput_vs_floor": "≥ 0.5",
    "gateway_memory_otel_stream_ttft_overhead_p50_ms": "≤ 2",
    "gateway_memory_otel_spans_dropped": "= 0",
    "gateway_kafka_added_p50_ms": "≤ 5",
    "throughput_vs_floor": "≥ 0.5",
    "throughput_vs_litellm": "≥ 2",
    "stream_ttft_overhead_p50_ms": "≤ 2",
    "added_p50_vs_agl": "≤ 0.3",
    "throughput_vs_agl": "≥ 3",
    "idle_gateway_ticket_added_cpu_ms_per_call": "≤ 0.01",
    "idle_gateway_added_cpu_ticket_vs_topic": "≤ 0.05",
}


def goal_targets(key: str) -> set[str]:
    """The targets a goal's figure needs: those its name mentions (the longest name where two overlap,
    as gateway_memory in gateway_memory_otel), the floor for a recording cost or a ratio to it, else the
    embedded-bus gateway."""
    names = {t for t in TARGETS if re.search(rf"(^|_){t}(_|$)", key)}
    names -= {t for t in names for u in names if t != u and t in u}
    if "recording" in key or "floor" in key:
        names.add("floor")
    return names or {"gateway_memory"}


def goals_of(targets: list[str], figures: dict[str, float]) -> dict[str, str]:
    """The goals of the targets measured (every goal with the default targets): a goal whose figure no
    requested target produces is left out, one whose target failed stays, without a figure."""
    return {k: v for k, v in GOALS.items() if k in figures or goal_targets(k) <= set(targets)}


def median_figures(per_round: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds that have it (a target that could not run in one has none)."""
    keys = dict.fromkeys(k for f in per_round for k in f)
    return {key: statistics.median([f[key] for f in per_round if key in f]) for key in keys}


def _figures(r: Round, offered: float) -> dict[str, float]:
    """One round's figures; every difference is against the direct path measured in the same window
    (taking turns with the target), every ratio against a baseline of the same round."""
    rows, serial, sweep, ttfts = r["rows"], r["serial"], r["sweep"], r["ttfts"]
    opened = sweep[offered]
    d = rows["direct"]
    figures: dict[str, float] = {"offered_rate_rps": opened["direct"]["rate"]}
    for name in TARGETS:
        if name in opened:  # the goals' figures: open loop below saturation
            o = opened[name]
            figures[f"{name}_added_p50_ms"] = o["p50"] - o["direct_p50"]
            figures[f"{name}_added_p99_ms"] = o["p99"] - o["direct_p99"]
        if name in rows:  # closed loop: saturates the machine, so mostly queueing
            figures[f"{name}_closed_added_p50_ms"] = rows[name]["p50"] - d["p50"]
            figures[f"{name}_closed_added_p99_ms"] = rows[name]["p99"] - d["p99"]
            figures[f"{name}_serial_added_p50_ms"] = serial[name]["p50"] - serial[name]["direct_p50"]
    for name in ("gateway_memory", "gateway_memory_otel", "gateway_kafka"):  # recording: over the floor
        for kind in ("added_p50", "added_p99", "serial_added_p50"):
            if f"{name}_{kind}_ms" in figures and f"floor_{kind}_ms" in figures:
                what = kind.replace("added", "recording")
                figures[f"{name}_{what}_ms"] = figures[f"{name}_{kind}_ms"] - figures[f"floor_{kind}_ms"]
    if "gateway_memory" in rows:  # the throughput and streaming goals are the embedded-bus gateway's
        g = rows["gateway_memory"]["rps"]
        for name, key in (("floor", "throughput_vs_floor"), ("litellm", "throughput_vs_litellm")):
            if name in rows:
                figures[key] = g / rows[name]["rps"]
        if "gateway_memory_httpx" in rows:  # not a goal: what the hand-written upstream client buys
            figures["throughput_wire_vs_httpx_upstream"] = g / rows["gateway_memory_httpx"]["rps"]
        over = {k: t["p50"] - t["direct_p50"] for k, t in ttfts.items()}
        figures["stream_ttft_overhead_p50_ms"] = over["gateway_memory"]
        if "floor" in over:
            figures["floor_stream_ttft_overhead_p50_ms"] = over["floor"]
            figures["stream_ttft_recording_p50_ms"] = over["gateway_memory"] - over["floor"]
        if "gateway_memory_otel" in over:
            figures["gateway_memory_otel_stream_ttft_overhead_p50_ms"] = over["gateway_memory_otel"]
        if "agl" in rows:  # side by side with Agent Lightning 1.0.2's proxy, same upstream and load
            figures["throughput_vs_agl"] = g / rows["agl"]["rps"]
            # open loop at the goals' rate, else at the highest rate AGL's proxy could carry
            both = [f for f, runs in res_sweep(sweep) if "agl" in runs and "gateway_memory" in runs]
            if both:
                frac = max(both)
                runs = sweep[frac]
                ours, theirs = (runs[k]["p50"] - runs[k]["direct_p50"] for k in ("gateway_memory", "agl"))
                figures["added_p50_vs_agl"] = ours / theirs
                figures["agl_compared_at_rps"] = runs["direct"]["rate"]
            ours, theirs = (serial[k]["p50"] - serial[k]["direct_p50"] for k in ("gateway_memory", "agl"))
            figures["serial_added_p50_vs_agl"] = ours / theirs
    if "gateway_memory_otel" in rows:  # export on, in the gateway's process: beside the same gateway off
        o = rows["gateway_memory_otel"]
        if "floor" in rows:
            figures["gateway_memory_otel_throughput_vs_floor"] = o["rps"] / rows["floor"]["rps"]
        if "gateway_memory" in rows:
            figures["otel_export_cpu_ms_per_call"] = o["cpu_ms"] - rows["gateway_memory"]["cpu_ms"]
            figures["otel_export_throughput_vs_off"] = o["rps"] / rows["gateway_memory"]["rps"]
        for kind in ("added_p50", "added_p99"):
            if f"gateway_memory_otel_{kind}_ms" in figures and f"gateway_memory_{kind}_ms" in figures:
                figures[f"otel_export_{kind}_ms"] = (
                    figures[f"gateway_memory_otel_{kind}_ms"] - figures[f"gateway_memory_{kind}_ms"]
                )
    exports = r.get("exports", {})
    if "gateway_memory_otel" in exports:  # every call the gateway recorded, as a span at the sink
        e = exports["gateway_memory_otel"]
        figures["gateway_memory_otel_calls"] = e["calls"]
        figures["gateway_memory_otel_spans_received"] = e["spans"]
        figures["gateway_memory_otel_spans_dropped"] = e["dropped"]
    for name in ("gateway_memory", "gateway_memory_otel", "gateway_kafka"):
        if name in rows and "floor" in rows:  # CPU the gateway adds over the floor per call
            figures[f"{name}_cpu_over_floor_ms"] = rows[name]["cpu_ms"] - rows["floor"]["cpu_ms"]
    for name in ("direct", "floor", "gateway_memory", "gateway_kafka"):
        if name in opened:  # CPU a call at the goals' open-loop rate (what bounds the Kafka goal)
            figures[f"{name}_open_cpu_ms_per_call"] = opened[name]["cpu_ms"]
    if "broker_cpu_ms" in opened.get("gateway_kafka", {}):  # vs direct: the broker's idle work subtracted
        figures["gateway_kafka_open_broker_cpu_ms_per_call"] = (
            opened["gateway_kafka"]["broker_cpu_ms"] - opened["direct"]["broker_cpu_ms"]
        )
    for name, row in rows.items():
        figures[f"{name}_rps"] = row["rps"]
        figures[f"{name}_cpu_ms_per_call"] = row["cpu_ms"]
    return figures


def figures_rounds(res: dict[str, Any]) -> int:
    return int(res["figures"]["rounds"])


def res_sweep(
    sweep: dict[float, dict[str, dict[str, float]]],
) -> list[tuple[float, dict[str, dict[str, float]]]]:
    return sorted(sweep.items())


def print_table(res: dict[str, Any], args: argparse.Namespace) -> None:
    rows, serial, opened = res["rows"], res["serial"], res["opened"]
    d = rows["direct"]
    n, c = args.requests, args.concurrency
    print(
        f"gateway benchmark, loopback, instant fake upstream; load generator, upstream and each proxy in"
        f" separate processes on {os.cpu_count()} CPUs"
    )
    print(
        f"closed loop: {n} requests, {c} clients back to back (saturates the machine: +p50/+p99 are"
        f" mostly queueing); serial: 1 client"
    )
    print(
        f"{'target':<16}{'p50 ms':>9}{'p99 ms':>9}{'+p50':>8}{'+p99':>8}{'req/s':>9}{'vs direct':>10}"
        f"{'serial p50':>11}{'+serial':>9}{'cpu ms/call':>12}"
    )
    for name, r in rows.items():
        s = serial[name]
        print(
            f"{name:<16}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['p50'] - d['p50']:>8.2f}{r['p99'] - d['p99']:>8.2f}"
            f"{r['rps']:>9.0f}{r['rps'] / d['rps']:>9.2f}x{s['p50']:>11.2f}"
            f"{s['p50'] - s['direct_p50']:>9.2f}{r['cpu_ms']:>12.2f}"
        )
    od = opened["direct"]
    print()
    print(
        f"open loop (the goals' added latency): {c} clients, Poisson arrivals at {od['rate']:.0f} req/s"
        f" = {args.offered:.2f} x direct capacity, {args.duration:.0f} s per target; latency from the"
        " scheduled arrival"
    )
    print(f"{'target':<16}{'p50 ms':>9}{'p99 ms':>9}{'+p50':>8}{'+p99':>8}{'load':>8}")
    for name, o in opened.items():
        print(
            f"{name:<16}{o['p50']:>9.2f}{o['p99']:>9.2f}{o['p50'] - o['direct_p50']:>8.2f}"
            f"{o['p99'] - o['direct_p99']:>8.2f}{o['rate'] / rows[name]['rps']:>7.0%}"
        )
    print("(load: offered rate / the target's own closed-loop capacity)")
    print()
    print("open loop at other rates: +p50 / +p99 ms (load)")
    for frac, runs in sorted(res["sweep"].items()):
        base = runs["direct"]
        cells = [
            f"{name} {o['p50'] - o['direct_p50']:.2f} / {o['p99'] - o['direct_p99']:.2f} ({o['rate'] / rows[name]['rps']:.0%})"
            for name, o in runs.items()
            if name != "direct"
        ]
        print(f"  {frac:.2f} x direct = {base['rate']:.0f} req/s: " + "; ".join(cells))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print()
    print(f"figures: the median over {figures_rounds(res)} rounds (the tables above: the last round)")
    print(f"{'figure':<40}{'value':>10}  goal")
    figures = res["figures"]
    for key, goal in res["goals"].items():
        value = figures.get(key)
        shown = f"{value:>10.2f}" if value is not None else f"{'n/a':>10}"
        print(f"{key:<40}{shown}  {goal}")
    for key, what in (
        ("floor_added_p50_ms", "the floor vs direct: what any forwarder on this stack adds"),
        ("floor_added_p99_ms", "the floor vs direct, p99"),
        ("gateway_memory_recording_p99_ms", "the gateway vs the floor, p99"),
        ("floor_serial_added_p50_ms", "the floor vs direct, 1 client"),
        ("gateway_kafka_recording_p50_ms", "the gateway on Kafka vs the floor"),
        ("stream_ttft_recording_p50_ms", "streamed TTFT, the gateway vs the floor"),
        ("gateway_memory_cpu_over_floor_ms", "CPU a call the gateway adds over the floor, closed loop"),
        ("otel_export_added_p50_ms", "export on vs off: the gateway's added p50, open loop"),
        ("otel_export_added_p99_ms", "export on vs off: the gateway's added p99, open loop"),
        ("otel_export_cpu_ms_per_call", "export on vs off: the gateway process's CPU a call, closed loop"),
        ("otel_export_throughput_vs_off", "export on vs off: closed-loop req/s"),
        ("gateway_memory_otel_calls", "calls the export target's gateway recorded (its /metrics)"),
        ("gateway_memory_otel_spans_received", "call spans the OTLP/HTTP sink received"),
    ):
        if key in figures:
            print(f"{key:<40}{figures[key]:>10.2f}  ({what})")
    for key, what in (
        ("gateway_memory_open_cpu_ms_per_call", "gateway CPU a call, open loop, in-process bus"),
        ("gateway_kafka_open_cpu_ms_per_call", "gateway CPU a call, open loop, Kafka"),
        ("gateway_kafka_open_broker_cpu_ms_per_call", "Kafka broker CPU a call, open loop, same CPUs"),
    ):
        if key in figures:  # CPU per call on the shared CPUs: what bounds the Kafka latency goal
            print(f"{key:<40}{figures[key]:>10.2f}  ({what})")
    for key, what in (
        (
            "agl_compared_at_rps",
            "open-loop rate of added_p50_vs_agl (AGL's proxy carries less than the goals' rate)",
        ),
        ("serial_added_p50_vs_agl", "the same ratio with 1 client"),
    ):
        if key in figures:
            print(f"{key:<40}{figures[key]:>10.2f}  ({what})")
    if "throughput_wire_vs_httpx_upstream" in figures:
        print(
            f"{'throughput_wire_vs_httpx_upstream':<40}{figures['throughput_wire_vs_httpx_upstream']:>10.2f}"
            "  (the gateway with gateway/upstream/wire.py vs with httpx upstream)"
        )
    for mode in ADMISSIONS:
        key = f"idle_gateway_{mode}_added_cpu_ms_per_call"
        if key in figures:
            print(
                f"{key:<40}{figures[key]:>10.3f}  (idle gateway beside a loaded one, episodes by {mode}: "
                f"{figures[f'idle_gateway_{mode}_quiet_cpu_ms_per_s']:.1f} ms/s quiet, "
                f"{figures[f'idle_gateway_{mode}_loaded_cpu_ms_per_s']:.1f} ms/s during the load)"
            )
    for name, r in rows.items():
        if r.get("failed"):
            print(f"note: {name}: {r['failed']:.0f} requests failed (excluded from latency)")
    for note in res["notes"]:
        print(f"note: {note}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serial", type=int, default=200, help="requests for the 1-client figures")
    parser.add_argument("--stream", type=int, default=100, help="streamed requests for TTFT")
    parser.add_argument(
        "--offered", type=float, default=0.1, help="the goals' open-loop rate, a fraction of direct capacity"
    )
    parser.add_argument(
        "--sweep",
        type=lambda v: [float(x) for x in v.split(",") if x],
        default=[0.05, 0.2],
        help="more open-loop rates (fractions of direct capacity), printed for context",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of open loop per target")
    parser.add_argument("--rounds", type=int, default=3, help="passes over every target; figures are medians")
    parser.add_argument(
        "--targets",
        type=lambda v: [x for x in v.split(",") if x],
        default=list(TARGETS),
        help=f"proxies to measure besides direct (default: all of {','.join(TARGETS)})",
    )
    a = parser.parse_args()
    if a.rounds < 1:
        parser.error("--rounds must be at least 1")
    t_start = time.monotonic()
    result = asyncio.run(main(a))
    result["notes"].append(f"benchmark ran {time.monotonic() - t_start:.0f} s")
    if a.json:
        print(json.dumps({"figures": result["figures"], "goals": goals_of(a.targets, result["figures"])}))
    else:
        print_table(result, a)
