"""Batched ``/v1/completions`` prompts: each choice is recorded with its own prompt's ids, or flagged.

vLLM (and the fake) answer ``n`` choices per prompt at ``index = prompt_i * n + j``, each with its own
``prompt_token_ids``. A response that cannot be matched to the request's prompts is recorded, not
token-faithful, with no prompt ids outside the raw response.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway.recording.capture import capture_response
from gateway.recording.prepare import PromptLayout, prompt_layout
from reward_service.transitions import assemble
from schemas import LLMCallRecorded
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(30)


def _ids(text: str) -> list[int]:
    return [*text.encode()]  # the fake's tokenizer: one id per byte


@pytest.mark.parametrize("stream", [False, True])
async def test_each_choice_carries_its_own_prompt_ids(tmp_path: Path, stream: bool) -> None:
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        body = {"prompt": ["What is 1+1?", "Name a colour:"], "n": 2, "max_tokens": 8, "stream": stream}
        r = await h.client.post(f"/episodes/{ep}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert call.token_faithful and call.prompt_token_ids is None
        assert [c.index for c in call.choices] == [0, 1, 2, 3]
        expected = [_ids("What is 1+1?")] * 2 + [_ids("Name a colour:")] * 2
        assert [c.prompt_token_ids for c in call.choices] == expected
        assert call.prompt_tokens == len(_ids("What is 1+1?")) + len(_ids("Name a colour:"))
        transitions = assemble([call], reward=1.0).transitions
        assert [t.prompt_ids for t in transitions] == expected
        assert [t.response_ids for t in transitions] == [c.token_ids for c in call.choices]
        if not stream:  # the agent asked for no ids: none reach it
            assert all("prompt_token_ids" not in c for c in r.json()["choices"])


async def test_token_id_prompts_are_matched_and_single_prompts_unchanged(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/completions"
        assert (await h.client.post(url, json={"prompt": [[5, 6, 7], [8, 9]]})).status_code == 200
        assert (await h.client.post(url, json={"prompt": [5, 6, 7], "n": 2})).status_code == 200
        assert (await h.client.post(url, json={"prompt": ["only one"]})).status_code == 200
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
        batched, single, listed = sorted(calls, key=lambda c: c.call_seq)
        assert batched.token_faithful and [c.prompt_token_ids for c in batched.choices] == [[5, 6, 7], [8, 9]]
        assert single.token_faithful and single.prompt_token_ids == [5, 6, 7]
        assert all(c.prompt_token_ids is None for c in single.choices)  # the call's ids apply
        assert listed.token_faithful and listed.prompt_token_ids == _ids("only one")


def _layout_breaker(choices: list[dict[str, Any]]) -> FastAPI:
    """An upstream whose answer to any completion is ``choices`` (with ids and logprobs)."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        out = [
            {
                "text": "x",
                "finish_reason": "stop",
                "token_ids": [120],
                "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1], "top_logprobs": [{"x": -0.1}]},
                **c,
            }
            for c in choices
        ]
        return Response(orjson.dumps({"id": "c", "object": "text_completion", "choices": out}))

    return app


BROKEN: dict[str, list[dict[str, Any]]] = {
    "too few choices": [{"index": 0, "prompt_token_ids": [1]}],
    "index outside prompt_i * n + j": [
        {"index": 0, "prompt_token_ids": [1]},
        {"index": 2, "prompt_token_ids": [2]},
    ],
    "a choice without prompt ids": [{"index": 0, "prompt_token_ids": [1]}, {"index": 1}],
    "ids other than the token prompt sent": [
        {"index": 0, "prompt_token_ids": [1]},
        {"index": 1, "prompt_token_ids": [7]},
    ],
}


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_unmatchable_batched_call_is_recorded_but_not_token_faithful(tmp_path: Path, case: str) -> None:
    async with GatewayHarness(tmp_path, upstream_app=_layout_breaker(BROKEN[case])) as h:
        ep = await h.open_episode()
        r = await h.client.post(f"/episodes/{ep}/v1/completions", json={"prompt": [[1], [2]]})
        assert r.status_code == 200, r.text
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert not call.token_faithful and call.prompt_token_ids is None
        assert all(c.prompt_token_ids is None for c in call.choices)
        assert call.response and "prompt_token_ids" in call.response  # what the engine said is kept
        assemble_out = assemble([call], reward=1.0)
        assert assemble_out.transitions == [] and assemble_out.no_token_ids == 1


def test_layouts_and_inconsistent_choices_of_one_prompt() -> None:
    assert prompt_layout({"prompt": "a"}, "completions") == PromptLayout(1, 1, (None,))
    assert prompt_layout({"prompt": [3, 4], "n": 2}, "completions") == PromptLayout(1, 2, ([3, 4],))
    assert prompt_layout({"prompt": ["a", [3]], "n": 3}, "completions") == PromptLayout(2, 3, (None, [3]))
    assert prompt_layout({"messages": [], "n": 2}, "chat.completions") == PromptLayout(1, 2, (None,))
    lp = {"tokens": ["x"], "token_logprobs": [-0.1]}
    ch = {"token_ids": [1], "logprobs": lp}
    split = {
        "choices": [{**ch, "index": 0, "prompt_token_ids": [1]}, {**ch, "index": 1, "prompt_token_ids": [9]}]
    }
    assert not capture_response(split, "completions", PromptLayout(1, 2, (None,))).token_faithful
    assert not capture_response(split, "completions", PromptLayout(1, 2, (None,))).prompt_token_ids
    assert capture_response(split, "completions", PromptLayout(2, 1, (None, None))).token_faithful
