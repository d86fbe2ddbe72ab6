"""The gateway in front of the real embedded engine (tiny model, ASGI transport): ids as the engine saw them."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CORPUS = [
    f"<|im_start|>user\\nWhat is {a}+{b}?<|im_end|>\\n<|im_start|>assistant\\nThe answer is {a + b}.<|im_end|>"
    for a in range(0, 40, 3)
    for b in range(0, 40, 7)
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    return build_tiny(
        tmp_path_factory.mktemp("tiny") / "model",
        CORPUS,
        vocab_size=320,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
    )


async def test_calls_through_the_embedded_engine_are_token_faithful(tiny_dir, tmp_path):
    from trainer.engine import InferenceEngine
    from trainer.engine.app import create_engine_app

    engine = InferenceEngine.from_pretrained(tiny_dir, max_model_len=256)
    try:
        async with GatewayHarness(
            tmp_path, upstream_app=create_engine_app(engine), kind=UpstreamKind.embedded
        ) as h:
            ep = await h.open_episode()
            url = f"/episodes/{ep}/v1/chat/completions"
            msgs = [{"role": "user", "content": "What is 3+7?"}]
            r1 = await h.client.post(url, json={"messages": msgs, "max_tokens": 12, "seed": 1})
            assert r1.status_code == 200, r1.text
            body = r1.json()
            assert "prompt_token_ids" not in body and body["choices"][0]["logprobs"] is None
            history = [*msgs, body["choices"][0]["message"], {"role": "user", "content": "What is 6+7?"}]
            r2 = await h.client.post(url, json={"messages": history, "max_tokens": 12, "stream": True})
            assert r2.status_code == 200
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), within_s=60, count=2)
            first, second = sorted(calls, key=lambda c: c.call_seq)
            expected = engine.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, return_dict=False
            )
            assert first.prompt_token_ids == [int(i) for i in expected]
            for call in (first, second):
                assert call.token_faithful and call.upstream is UpstreamKind.embedded
                ch = call.choices[0]
                assert ch.weight_versions == [0] * len(ch.token_ids or [])
                assert len(ch.logprobs or []) == len(ch.token_ids or []) > 0
            assert first.choices[0].text == body["choices"][0]["message"]["content"]
            assert second.streamed and second.extends_previous is not None
    finally:
        await engine.close()
