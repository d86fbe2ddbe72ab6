"""The vLLM weight sink against the live server: pause (keep) → reload from disk → reset the prefix cache →
label the version → resume, and ``/weight_info`` reporting it. A request sent while the server is paused
waits, and finishes on the new weights after the resume.

The "new weights" are the served model with its final norm negated (every logit flips sign, so greedy
decoding picks other tokens): an output from them cannot be mistaken for the original's.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.vllm.conftest import SERVED_NAME
from trainer.vllm_sink import VllmSink
from trainer.weights import WeightLoadError, WeightUpdate

pytestmark = pytest.mark.timeout(600)

PROMPT = "The capital of France is"


def flipped_copy(model_dir: Path, out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    out.mkdir()
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.norm.weight"] = -tensors["model.norm.weight"]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(model_dir / "config.json", out / "config.json")
    return out


async def greedy(client: httpx.AsyncClient, url: str) -> str:
    r = await client.post(
        url + "/v1/completions",
        json={"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0},
        timeout=120.0,
    )
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


async def test_a_new_version_goes_live_and_a_request_sent_while_paused_finishes_on_it(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    url = warm
    flipped = flipped_copy(vllm_model_dir, tmp_path / "flipped")
    marks: dict[str, float] = {}
    queued: list[asyncio.Task[str]] = []
    async with httpx.AsyncClient() as plain:
        original = await greedy(plain, url)

        async def on_request(request: httpx.Request) -> None:
            if request.url.path == "/resume":
                marks.setdefault("resume_sent", time.monotonic())  # the first load's

        async def on_response(response: httpx.Response) -> None:
            if response.request.url.path == "/pause":
                queued.append(asyncio.create_task(greedy(plain, url)))
                await asyncio.sleep(0.5)  # it reaches the paused server before the reload starts

        hooks = {"request": [on_request], "response": [on_response]}
        async with httpx.AsyncClient(event_hooks=hooks, timeout=300.0) as sink_client:
            sink = VllmSink(url + "/v1", client=sink_client)
            await sink.load(WeightUpdate(version=7, state_dict=dict, path=flipped / "model.safetensors"))
            assert sink.served_version == "7"
            [waiting] = queued
            during = await waiting
            marks["queued_done"] = time.monotonic()
            after = await greedy(plain, url)
            info = (await plain.get(url + "/weight_info")).json()
            # back to the served model, so the other tests see it again
            await sink.load(WeightUpdate(version=8, state_dict=dict, path=vllm_model_dir))
            restored = await greedy(plain, url)
        assert info["weight_version"] == "7"
        assert during == after != original  # the paused request ran on the new weights
        assert marks["queued_done"] > marks["resume_sent"]
        assert restored == original
        assert (await plain.get(url + "/weight_info")).json()["weight_version"] == "8"


async def test_a_checkpoint_without_weights_is_refused_before_vllm_is_touched(
    warm: str, tmp_path: Path
) -> None:
    """A reload that fails inside vLLM 0.32 leaves its engine dead at the next request (weights half-moved
    to the meta device): the sink refuses a directory without weights itself, and vLLM keeps serving."""
    url = warm
    empty = tmp_path / "empty"
    empty.mkdir()
    sent: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        sent.append(request.url.path)

    async with httpx.AsyncClient(event_hooks={"request": [on_request]}) as client:
        sink = VllmSink(url + "/v1", client=client)
        for path in (empty, tmp_path / "missing"):
            with pytest.raises(WeightLoadError, match=r"no \*\.safetensors"):
                await sink.load(WeightUpdate(version=9, state_dict=dict, path=path))
    assert sent == []
    async with httpx.AsyncClient() as plain:
        assert (await plain.get(url + "/is_paused")).json()["is_paused"] is False
        assert await greedy(plain, url)
