"""The demo's warm-start settings and the chat rendering every demo agent shares: what a warm start's
cache key is made of (:class:`WarmStartConfig`, :class:`GateConfig`), without the training code, so the
per-agent definitions (``agents.py``, ``sql_demo.py``) and the warm start (``warmstart.py``) both stand
on it and not on each other."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = 1  # bump when the data or the recipe changes so old caches are not reused
DEFAULT_CACHE = Path.home() / ".cache" / "flywheel" / "demo"


@dataclass(frozen=True)
class WarmStartConfig:
    seed: int = 0
    hidden: int = 128  # 4 layers × 128: ~0.8 M parameters; copying emerged after ~350 SFT steps here
    layers: int = 4
    vocab_size: int = 512
    demos: int = 4000
    # 1000 × 32 demonstrations: fewer left too few successes for RL's groups (docs/results/tuning.md)
    sft_steps: int = 1000
    sft_batch: int = 32
    sft_lr: float = 3e-3
    p_format: float = 0.3
    p_copy_expr: float = 0.3
    p_copy_answer: float = 0.3
    # Added with the SQL demo (examples/demo/agents.py); a calc warm start's key leaves them
    # out, so the caches built before them are still found.
    agent: str = "calc"
    max_positions: int = 512
    databases: int = 0  # sql: generated databases (a quarter held out), questions on each, teacher noise
    questions_per_db: int = 0
    mistake_rate: float = 0.0
    data_format: int = (
        0  # sql: examples/demo_agents/sql_agent/data.py's version (its benchmark and its teacher)
    )

    def key(self) -> str:
        fields = asdict(self)
        if self.agent == "calc":
            for name in _ADDED_FOR_SQL:
                fields.pop(name)
        blob = json.dumps({**fields, "format": FORMAT}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_ADDED_FOR_SQL = ("agent", "max_positions", "databases", "questions_per_db", "mistake_rate", "data_format")


@dataclass(frozen=True)
class GateConfig:
    min_success: float = 0.25  # 0 disables the gate
    tasks: int = 256
    max_attempts: int = 3  # the scheduled SFT, then up to two re-initialised runs
    reinit_below: float = 0.10  # below this, re-initialise; between this and min_success, top up
    top_up_steps: int = 250
    max_top_ups: int = 4  # per attempt
    top_up_lr_scale: float = 0.3  # of the scheduled SFT's peak rate (the SFT-only baseline's rate)
    top_up_best: bool = True  # no attempt passed: top up the best one checked, whatever its score

    def key(self, warm: WarmStartConfig) -> str:
        blob = json.dumps({**asdict(self), "warm": warm.key()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def top_up_key(self, warm: WarmStartConfig) -> str:
        """What shapes a top-up's result (not the thresholds, which only decide whether it runs)."""
        blob = json.dumps(
            {"steps": self.top_up_steps, "lr_scale": self.top_up_lr_scale, "warm": warm.key()}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    return [int(i) for i in ids]


def sample_replies(
    model: Any, tokenizer: Any, conversations: Sequence[Sequence[dict[str, str]]], max_new_tokens: int
) -> list[str]:
    """One reply per conversation, sampled at temperature 1 as the agents sample (the gates' check):
    one batched, left-padded ``generate`` over all of them, in eval mode, without gradients."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end
    rows = [render_chat(tokenizer, messages, True) for messages in conversations]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    was_training = model.training
    model.train(False)
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                eos_token_id=end,
                pad_token_id=pad,
            )
    finally:
        model.train(was_training)
    return [tokenizer.decode(out[row, width:], skip_special_tokens=True) for row in range(len(rows))]
