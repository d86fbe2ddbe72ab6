"""LoRA adapters in a live vLLM (``flywheel vllm serve --enable-lora``), loaded through Flywheel's sink.

An adapter for SmolLM2 built with peft (its B factors made non-zero, as training would) is exported by
the trainer's adapter backend and loaded at runtime by :class:`trainer.vllm_sink.VllmAdapterSink`
(``/v1/load_lora_adapter``, in place); requests naming the adapter are served by it (their logprobs
differ from the base's and match peft's own forward pass), and a second version replaces the first.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from tests.vllm.conftest import SERVED_NAME

pytestmark = pytest.mark.timeout(600)

PROMPT = "The capital of France is"


async def _first_token(url: str, model: str) -> tuple[int, float]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(timeout=300.0) as client:
        resp = await client.post(url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return int(choice["token_ids"][0]), float(choice["logprobs"]["token_logprobs"][0])


async def test_an_adapter_is_loaded_at_runtime_and_replaced_by_its_next_version(
    vllm_url: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from trainer.config import AlgorithmConfig, LoraOptions
    from trainer.lora import load_policies
    from trainer.vllm_sink import VllmAdapterSink
    from trainer.weights import WeightUpdate

    torch.manual_seed(0)
    policies = load_policies(
        vllm_model_dir, ["writer"], AlgorithmConfig(), LoraOptions(rank=8), torch_threads=1
    )
    writer = policies.adapters["writer"]
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    prompt_ids = tokenizer(PROMPT)["input_ids"]

    def peft_logprob(token: int) -> float:
        with torch.no_grad():
            policies.model.set_adapter("writer")
            logits = policies.model(torch.tensor([prompt_ids])).logits[0, -1].float()
        return float(torch.log_softmax(logits, -1)[token])

    sink = VllmAdapterSink(vllm_url, "writer")
    base = await _first_token(vllm_url, SERVED_NAME)
    served = []
    for version, scale in ((1, 0.02), (2, -0.05)):
        with torch.no_grad():
            for n, p in policies.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, abs(scale), generator=torch.Generator().manual_seed(version))
        path = writer.export_weights(tmp_path / f"v{version}")
        await sink.load(WeightUpdate(version, writer.state_dict, path))
        token, logprob = await _first_token(vllm_url, "writer")
        assert logprob == pytest.approx(peft_logprob(token), abs=2e-2), version
        served.append((token, logprob))
    print(f"base {base}, writer v1 {served[0]}, v2 {served[1]}")
    assert served[0] != base and served[1] != served[0]
    assert await _first_token(vllm_url, SERVED_NAME) == pytest.approx(base, abs=1e-4)  # the base untouched
    async with httpx.AsyncClient(timeout=30.0) as client:
        models = (await client.get(vllm_url + "/v1/models")).json()["data"]
    assert "writer" in {m["id"] for m in models}
