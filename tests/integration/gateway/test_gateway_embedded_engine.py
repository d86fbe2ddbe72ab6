"""The gateway in front of the real embedded engine (tiny model, ASGI transport): ids as the engine saw them."""

from __future__ import annotations

import pytest

from schemas import LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


async def test_calls_through_the_embedded_engine_are_token_faithful(tiny_dir, tmp_path):
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

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


async def test_batched_completion_prompts_train_on_their_own_prompt_ids(tiny_dir, tmp_path):
    """The real ``openai`` SDK's ``completions.create(prompt=[...], n=2)`` (plain and streamed) through
    the gateway and the reward service: the transition of each choice starts from its own prompt's ids."""
    import openai

    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app
    from reward_service.feedback import FeedbackMapping
    from reward_service.scoring import Scoring
    from reward_service.service import RewardService
    from reward_service.state import EpisodeStore
    from schemas import EPISODES, TRANSITIONS, EpisodeFinished, EpisodeScored, EpisodeStatus
    from tests.fakes.events import Collector

    engine = InferenceEngine.from_pretrained(tiny_dir, max_model_len=256)
    prompts = ["What is 3+7?", "The answer is"]
    try:
        async with GatewayHarness(
            tmp_path, upstream_app=create_engine_app(engine), kind=UpstreamKind.embedded
        ) as h:
            scoring = Scoring(
                fill_value=0.0, production_scorer="none", feedback=FeedbackMapping(), judge=None
            )
            reward = RewardService(h.bus, scoring, EpisodeStore())
            scored = await Collector().attach(h.bus, TRANSITIONS)
            await reward.start()
            try:
                ep = await h.open_episode()
                client = openai.AsyncOpenAI(
                    base_url=f"http://gateway/episodes/{ep}/v1", api_key="unused", http_client=h.client
                )
                plain = await client.completions.create(
                    model="policy", prompt=prompts, n=2, max_tokens=6, seed=3
                )
                assert [c.index for c in plain.choices] == [0, 1, 2, 3]
                stream = await client.completions.create(
                    model="policy", prompt=prompts, n=2, max_tokens=6, seed=4, stream=True
                )
                streamed = {c.index async for chunk in stream for c in chunk.choices}
                assert streamed == {0, 1, 2, 3}
                calls = await h.events.wait_for(
                    lambda e: isinstance(e, LLMCallRecorded), within_s=60, count=2
                )
                ids = [engine.tokenizer.encode(p) for p in prompts]
                assert ids[0] != ids[1]
                for call in calls:
                    assert call.token_faithful and call.prompt_token_ids is None
                    assert [c.prompt_token_ids for c in call.choices] == [ids[0], ids[0], ids[1], ids[1]]
                await h.bus.publish(
                    EPISODES, EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, reported_reward=1.0)
                )
                (event,) = await scored.wait_for(lambda e: isinstance(e, EpisodeScored), within_s=30)
                assert event.unusable_reason is None and len(event.transitions) == 8
                # one transition per choice, in (call, index) order: choice 2j+k on prompt j's ids
                assert [t.prompt_ids for t in event.transitions] == [ids[0], ids[0], ids[1], ids[1]] * 2
                by_call = sorted(calls, key=lambda c: c.call_seq)
                assert [t.response_ids for t in event.transitions] == [
                    c.token_ids for call in by_call for c in call.choices
                ]
            finally:
                await reward.stop()
                await scored.stop()
    finally:
        await engine.close()


async def test_a_previous_response_id_branch_starts_from_the_named_responses_ids(tiny_dir, tmp_path):
    """The Responses API through the embedded engine: a call naming an earlier response (not the
    episode's last call) is served from that response's recorded prompt and reply ids."""
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

    engine = InferenceEngine.from_pretrained(tiny_dir, max_model_len=256)
    try:
        async with GatewayHarness(
            tmp_path, upstream_app=create_engine_app(engine), kind=UpstreamKind.embedded
        ) as h:
            ep = await h.open_episode()
            url = f"/episodes/{ep}/v1/responses"
            ask = {"instructions": "Add.", "max_output_tokens": 40, "temperature": 0}
            r1 = await h.client.post(url, json={**ask, "input": "What is 3+7?"})
            assert r1.status_code == 200, r1.text
            first = r1.json()
            assert first["object"] == "response" and first["output"][0]["type"] == "message"
            for question in ("What is 6+7?", "What is 9+7?"):  # two branches off the first response
                r = await h.client.post(
                    url, json={**ask, "input": question, "previous_response_id": first["id"]}
                )
                assert r.status_code == 200, r.text
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), within_s=60, count=3)
            one, two, three = sorted(calls, key=lambda c: c.call_seq)
            assert all(c.endpoint == "responses" and c.token_faithful for c in (one, two, three))
            head = [*(one.prompt_token_ids or []), *(one.choices[0].token_ids or [])]
            assert (two.prompt_token_ids or [])[: len(head)] == head
            assert (three.prompt_token_ids or [])[: len(head)] == head  # the branch, not the last call
            assert two.extends_previous is True and three.extends_previous is False
    finally:
        await engine.close()
