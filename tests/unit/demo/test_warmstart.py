"""The warm start's SFT samples: the loss falls on exactly the assistant's turns."""

from __future__ import annotations

import random

import pytest

from demo_agents.calc_agent import tasks
from infra.application.demo.warmstart import GateConfig, WarmStartConfig, conversation_sample, demonstrations


@pytest.mark.timeout(60)
def test_sample_masks_select_assistant_turns_only() -> None:
    from trainer.models.tiny import build_tokenizer

    demos = demonstrations(WarmStartConfig(demos=60))
    tokenizer = build_tokenizer([m["content"] for d in demos for m in d] + ["system", "user", "assistant"])
    rng = random.Random(1)
    for i, messages in enumerate([*demos[:20], tasks.demonstration(tasks.make_task(47, "*", 38), rng)]):
        sample = conversation_sample(tokenizer, messages, i)
        assert len(sample.response_ids) == len(sample.response_mask)
        trained = [t for t, m in zip(sample.response_ids, sample.response_mask, strict=True) if m]
        want = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
        assert tokenizer.decode(trained) == want
        # prompt + response is exactly the rendered conversation (minus the template's final newline)
        last = max(j for j, m in enumerate(messages) if m["role"] == "assistant")
        full = tokenizer.apply_chat_template(messages[: last + 1], tokenize=True, return_dict=False)
        assert sample.prompt_ids + sample.response_ids == list(full)[:-1]


def test_cache_key_changes_with_every_setting() -> None:
    base = WarmStartConfig()
    assert base.key() == WarmStartConfig().key()
    assert len({base.key(), WarmStartConfig(seed=1).key(), WarmStartConfig(p_format=0.1).key()}) == 3


def test_gate_key_follows_the_warm_start_and_its_own_settings() -> None:
    gate = GateConfig()
    keys = {
        gate.key(WarmStartConfig()),
        gate.key(WarmStartConfig(seed=1)),
        GateConfig(min_success=0.3).key(WarmStartConfig()),
    }
    assert len(keys) == 3
    assert gate.key(WarmStartConfig()) == GateConfig().key(WarmStartConfig())
