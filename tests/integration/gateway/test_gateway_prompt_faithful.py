"""A substituted prompt stays token-faithful: the recorded prompt ids are the substituted text's ids,
as the real embedded engine tokenised them, on every call of the episode."""

from __future__ import annotations

import pytest

from schemas import CONTROL, LLMCallRecorded, PromptComponent, PromptVersionActivated, PromptVersionRequested
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

AGENT_SYSTEM = "Use CALC: <expr> then ANSWER: <n>."
CANDIDATE = "Answer with ANSWER: <n> after CALC: <expr>."


async def test_recorded_prompt_ids_are_those_of_the_substituted_prompt(tiny_dir, tmp_path):
    from gateway.upstream.client import UpstreamKind
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

    engine = InferenceEngine.from_pretrained(tiny_dir, max_model_len=256)
    try:
        async with GatewayHarness(
            tmp_path, upstream_app=create_engine_app(engine), kind=UpstreamKind.embedded
        ) as h:
            comp = PromptComponent(name="system_prompt", original=AGENT_SYSTEM, text=CANDIDATE)
            await h.bus.publish(
                CONTROL, PromptVersionRequested(prompt_version="p-cand", components=[comp], producer="test")
            )
            await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated))
            ep = await h.open_episode()
            url = f"/episodes/{ep}/v1/chat/completions"
            msgs = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": "What is 3+7?"}]
            r1 = await h.client.post(url, json={"messages": msgs, "max_tokens": 8, "seed": 1})
            assert r1.status_code == 200, r1.text
            history = [*msgs, r1.json()["choices"][0]["message"], {"role": "user", "content": "RESULT: 10"}]
            r2 = await h.client.post(url, json={"messages": history, "max_tokens": 8, "stream": True})
            assert r2.status_code == 200
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), within_s=60, count=2)
            first, second = sorted(calls, key=lambda c: c.call_seq)

            def ids(messages: list[dict[str, str]]) -> list[int]:
                out = engine.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, return_dict=False
                )
                return [int(i) for i in out]

            seen = [{"role": "system", "content": CANDIDATE}, msgs[1]]
            assert first.prompt_token_ids == ids(seen)  # what the model saw ...
            assert first.prompt_token_ids != ids(msgs)  # ... not what the agent sent
            assert first.token_faithful and second.token_faithful
            assert first.prompt_version == second.prompt_version == "p-cand"
            # the later call of the episode is substituted the same way (so merging sees one prompt)
            assert second.prompt_token_ids == ids([seen[0], *history[1:]])
    finally:
        await engine.close()
