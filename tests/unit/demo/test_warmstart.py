"""The warm start's SFT samples: the loss falls on exactly the assistant's turns."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from examples.demo import warmstart
from examples.demo.warmstart import GateConfig, WarmStartConfig, conversation_sample, demonstrations
from examples.demo_agents.calc_agent import tasks


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


def _fake_top_ups(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Path, int]]:
    """``_top_up`` without SFT: each call makes a new directory and is logged."""
    calls: list[tuple[Path, int]] = []

    def top_up(
        cfg: WarmStartConfig, gate: GateConfig, model_dir: Path, root: Path, n: int, agent: object
    ) -> Path:
        calls.append((model_dir, n))
        return root / "sft"

    monkeypatch.setattr(warmstart, "_top_up", top_up)
    return calls


@pytest.mark.timeout(30)
def test_when_every_attempt_fails_below_reinit_the_best_one_is_topped_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _fake_top_ups(monkeypatch, tmp_path)
    gate = GateConfig(min_success=0.25, reinit_below=0.10, max_top_ups=3)
    history = [
        {"model_dir": str(tmp_path / "sft"), "success": 0.016, "attempt": 0, "top_up": 0},
        {"model_dir": str(tmp_path / "attempt-1" / "sft"), "success": 0.090, "attempt": 1, "top_up": 0},
        {"model_dir": str(tmp_path / "attempt-2" / "sft"), "success": 0.078, "attempt": 2, "top_up": 0},
    ]
    scores = iter([0.15, 0.27])

    def check(model_dir: Path, attempt: int, top_up: int) -> float:
        history.append({"model_dir": str(model_dir), "success": 0.0, "attempt": attempt, "top_up": top_up})
        return next(scores)

    passed = warmstart._top_up_best(WarmStartConfig(seed=2), gate, history, check, agent=None)  # type: ignore[arg-type]
    assert passed
    assert [n for _, n in calls] == [1, 2]  # stopped at the first that passed, not at max_top_ups
    assert calls[0][0] == tmp_path / "attempt-1" / "sft"  # the best attempt (9.0 %), not the last
    assert (
        calls[1][0] == calls[0][0].parent / f"topup-{gate.top_up_key(WarmStartConfig(seed=2))}" / "1" / "sft"
    )
    assert [(h["attempt"], h["top_up"]) for h in history[3:]] == [(1, 1), (1, 2)]


@pytest.mark.timeout(30)
def test_a_best_model_the_loop_already_topped_up_is_not_topped_up_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _fake_top_ups(monkeypatch, tmp_path)
    gate = GateConfig(min_success=0.25, reinit_below=0.10, max_top_ups=2)
    history = [
        {"model_dir": str(tmp_path / "sft"), "success": 0.12, "attempt": 0, "top_up": 0},
        {"model_dir": str(tmp_path / "t1"), "success": 0.18, "attempt": 0, "top_up": 1},
        {"model_dir": str(tmp_path / "t2"), "success": 0.20, "attempt": 0, "top_up": 2},
    ]
    assert not warmstart._top_up_best(WarmStartConfig(seed=2), gate, history, lambda *a: 1.0, agent=None)  # type: ignore[arg-type]
    assert calls == []
