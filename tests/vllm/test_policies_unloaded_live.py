"""A policy's call that reaches a live vLLM before its adapter is loaded there is served, not lost.

vLLM answers an adapter's name only once the adapter is loaded (``/v1/load_lora_adapter``); the trainer
loads each untrained adapter's version 0 when it starts, but a gateway can receive a policy's calls before
that (the trainer not started yet, or vLLM restarted without the adapter). The gateway then serves the
call with the base, which is what the adapter's version 0 answers (its ``B`` factors are zero), and
records it as the adapter's version 0: no 404 reaches the agent, and the recorded version is the one whose
outputs the agent got. Once the adapter is loaded, its calls go to it under its own name.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from schemas import LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness
from tests.vllm.conftest import SERVED_NAME
from trainer.config import AlgorithmConfig

pytestmark = pytest.mark.timeout(600)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def test_a_call_for_an_adapter_vllm_has_not_loaded_is_served_by_the_base_as_version_0(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    from trainer.lora import load_policies
    from trainer.vllm_sink import VllmAdapterSink
    from trainer.weights import WeightUpdate

    adapter = f"unloaded-{uuid.uuid4().hex[:8]}"  # a name no other test of the shared server loaded
    body = {"messages": QUESTION, "max_tokens": 6, "temperature": 0.0, "logprobs": True}
    async with httpx.AsyncClient(timeout=300.0) as client:
        # the precondition: vLLM itself refuses the name of an adapter it has not loaded
        r = await client.post(warm + "/v1/chat/completions", json={**body, "model": adapter})
        assert r.status_code == 404, r.text
        direct = await client.post(warm + "/v1/chat/completions", json={**body, "model": SERVED_NAME})
        assert direct.status_code == 200, direct.text
    base_text = direct.json()["choices"][0]["message"]["content"]

    # the policy is selected by the model name the agent asks for: a name vLLM does not know either
    async with GatewayHarness(
        tmp_path, upstream_url=warm + "/v1", upstream_timeout_s=300.0, policies=adapter
    ) as h:
        episode = await h.open_episode()
        r = await h.client.post(
            f"/episodes/{episode}/v1/chat/completions", json={**body, "model": adapter}, timeout=300.0
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == base_text  # the base's greedy answer
        first = (await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), 30.0))[0]
        assert first.status_code == 200 and first.upstream is UpstreamKind.vllm
        assert (first.adapter, first.adapter_version) == (adapter, 0), first
        assert first.model == adapter and first.token_faithful and first.choices[0].logprobs

        # the adapter's version 0 as the trainer exports and loads it at start: its calls now go to it
        policies = await asyncio.to_thread(load_policies, vllm_model_dir, [adapter], AlgorithmConfig())
        out = policies.adapters[adapter].export_weights(tmp_path / "v0")
        sink = VllmAdapterSink(warm, adapter)
        try:
            await sink.load(WeightUpdate(version=0, state_dict=dict, path=out))
            async with httpx.AsyncClient(timeout=300.0) as client:
                served = {m["id"] for m in (await client.get(warm + "/v1/models")).json()["data"]}
                assert adapter in served, served
                by_name = await client.post(warm + "/v1/chat/completions", json={**body, "model": adapter})
            assert by_name.status_code == 200, by_name.text
            r = await h.client.post(
                f"/episodes/{episode}/v1/chat/completions", json={**body, "model": adapter}, timeout=300.0
            )
            assert r.status_code == 200, r.text
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), 30.0, 2)
        finally:
            await sink.unload()  # the shared server as it was, for the tests that follow
    second = sorted(calls, key=lambda c: c.call_seq)[1]
    assert (second.adapter, second.adapter_version, second.status_code) == (adapter, 0, 200), second
    # served under the adapter's own name: vLLM's response names the model it served
    assert orjson_model(second.response) == adapter
    assert orjson_model(first.response) == SERVED_NAME


def orjson_model(response: str | None) -> str:
    import orjson

    assert response is not None
    return str(orjson.loads(response)["model"])
