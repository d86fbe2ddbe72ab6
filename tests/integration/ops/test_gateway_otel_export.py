"""``flywheel gateway`` on the in-process bus with ``FLYWHEEL_OTLP_ENDPOINT`` set: the OpenTelemetry
exporter runs in the gateway's process (``flywheel.alone.GatewayProcess``; the bus is that
process's, so its consumers live there) and each call reaches the collector as a GenAI span.

The gateway is the real CLI in a process of its own, in front of the fake vLLM of
``tests/fakes/upstream.py``; the collector is an OTLP/HTTP endpoint in this process that decodes each
export request with ``opentelemetry-proto`` (what a collector does with the body) and keeps its spans.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infra.service import HttpServer
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

pytestmark = pytest.mark.timeout(120)

ADMIN = "test-admin"
ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collector(spans: list[Span]) -> Starlette:
    async def traces(request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])


def _attrs(span: Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def _spawn(tmp_path: Path, upstream: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """``flywheel gateway`` on the in-process bus (its stderr in ``tmp_path/gateway.log``); its URL."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "OTEL_"))}
    with (tmp_path / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flywheel.cli.main", "gateway", "--upstream", upstream],
            env={
                **base,
                "FLYWHEEL_BUS": "memory",
                "FLYWHEEL_DATA_DIR": str(tmp_path),
                "FLYWHEEL_ADMIN_TOKEN": ADMIN,
                "FLYWHEEL_GATEWAY_PORT": str(port),
                "FLYWHEEL_LOG_LEVEL": "WARNING",
                **env,
            },
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    return proc, f"http://127.0.0.1:{port}"


async def _start_gateway(
    tmp_path: Path, upstream: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    proc, url = _spawn(tmp_path, upstream, env)
    async with httpx.AsyncClient() as c:
        for _ in range(600):
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            try:
                if (await c.get(f"{url}/readyz", timeout=2)).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    proc.wait()
    raise AssertionError("flywheel gateway did not become ready in 60 s")


async def _calls(url: str, n: int) -> str:
    """Open an episode and make ``n`` chat calls in it; its id."""
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.post(f"{url}/admin/episodes", headers={"Authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        episode = r.json()
        for i in range(n):
            body = {"model": "policy", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 8}
            (await c.post(f"{episode['base_url']}/chat/completions", json=body)).raise_for_status()
    return str(episode["episode_id"])


async def _stop(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(proc.wait, 30)
    assert rc == 0, (tmp_path / "gateway.log").read_text()


async def test_the_gateway_alone_exports_each_call_as_a_genai_span(tmp_path: Path) -> None:
    spans: list[Span] = []
    collector = HttpServer(_collector(spans), port=0)
    upstream = HttpServer(create_fake_upstream(FakeUpstreamConfig(keep_requests=False, reply="4")), port=0)
    collector_url, upstream_url = await collector.start(), await upstream.start()
    try:
        proc, url = await _start_gateway(
            tmp_path, f"{upstream_url}/v1", {"FLYWHEEL_OTLP_ENDPOINT": collector_url}
        )
        try:
            episode_id = await _calls(url, 3)
            # batched every second on the SDK's thread, while the gateway keeps serving
            for _ in range(100):
                if len(spans) >= 3:
                    break
                await asyncio.sleep(0.1)
        finally:
            await _stop(proc, tmp_path)
    finally:
        await collector.stop()
        await upstream.stop()
    calls = [s for s in spans if s.name == "chat policy"]
    assert len(calls) == 3, [s.name for s in spans]
    for span in calls:
        attrs = _attrs(span)
        assert attrs["gen_ai.conversation.id"] == episode_id
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "policy"
    assert len({s.span_id for s in calls}) == 3
    assert len({s.trace_id for s in calls}) == 1  # one trace: the episode's


async def test_a_stopping_gateway_flushes_the_spans_still_queued(tmp_path: Path) -> None:
    spans: list[Span] = []
    collector = HttpServer(_collector(spans), port=0)
    upstream = HttpServer(create_fake_upstream(FakeUpstreamConfig(keep_requests=False, reply="4")), port=0)
    collector_url, upstream_url = await collector.start(), await upstream.start()
    try:
        proc, url = await _start_gateway(
            tmp_path, f"{upstream_url}/v1", {"FLYWHEEL_OTLP_ENDPOINT": collector_url}
        )
        try:
            episode_id = await _calls(url, 2)
        finally:
            await _stop(proc, tmp_path)  # at once: the gateway stops, then the exporter flushes its queue
    finally:
        await collector.stop()
        await upstream.stop()
    calls = [s for s in spans if s.name == "chat policy"]
    assert len(calls) == 2, [s.name for s in spans]
    assert {_attrs(s)["gen_ai.conversation.id"] for s in calls} == {episode_id}


def test_a_bad_export_setting_is_a_one_line_error(tmp_path: Path) -> None:
    proc, _ = _spawn(tmp_path, "http://127.0.0.1:9/v1", {"FLYWHEEL_OTLP_MAX_QUEUE": "1"})
    assert proc.wait(timeout=60) == 1
    err = (tmp_path / "gateway.log").read_text()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "otlp_max_queue" in errors[0], err
    assert "Traceback" not in err


async def test_the_gateway_keeps_serving_when_its_export_child_dies(tmp_path: Path) -> None:
    """The spans are built and sent by a child process (``infra.otel.forward``); killing it stops the
    export, is logged, and the gateway keeps answering and stops cleanly."""
    spans: list[Span] = []
    collector = HttpServer(_collector(spans), port=0)
    upstream = HttpServer(create_fake_upstream(FakeUpstreamConfig(keep_requests=False, reply="4")), port=0)
    collector_url, upstream_url = await collector.start(), await upstream.start()
    try:
        proc, url = await _start_gateway(
            tmp_path,
            f"{upstream_url}/v1",
            {"FLYWHEEL_OTLP_ENDPOINT": collector_url, "FLYWHEEL_LOG_LEVEL": "INFO"},
        )
        try:
            await _calls(url, 1)
            for _ in range(100):  # the child sends the first call's span
                if spans:
                    break
                await asyncio.sleep(0.1)
            assert [s.name for s in spans] == ["chat policy"]
            started = [
                json.loads(line)
                for line in (tmp_path / "gateway.log").read_text().splitlines()
                if "otel_export.forwarding" in line
            ]
            child = int(started[0]["child"])
            assert child != proc.pid
            os.kill(child, signal.SIGKILL)
            for _ in range(100):
                if "otel_export.child_died" in (tmp_path / "gateway.log").read_text():
                    break
                await asyncio.sleep(0.1)
            assert "otel_export.child_died" in (tmp_path / "gateway.log").read_text()
            await _calls(url, 3)  # still answered: the events are dropped and counted, not queued
            dropped = 0.0
            async with httpx.AsyncClient() as c:
                for _ in range(100):  # the consumer reads the calls' events within its batch wait
                    metrics = (
                        await c.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
                    ).text
                    name = "flywheel_otel_forward_dropped_events_total "
                    dropped = sum(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith(name))
                    if dropped >= 3:
                        break
                    await asyncio.sleep(0.1)
            assert dropped >= 3
        finally:
            await _stop(proc, tmp_path)
    finally:
        await collector.stop()
        await upstream.stop()
    assert proc.returncode == 0
    assert [s.name for s in spans] == ["chat policy"]  # nothing after the child died
