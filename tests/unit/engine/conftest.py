"""A tiny model (a few hundred K parameters) built once per session, and a fresh engine per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

# Imported at collection, where no timeout runs: on a loaded 2-core machine this import alone can take
# tens of seconds, which must not count against the first test's timeout.
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: F401

CORPUS = [
    f"<|im_start|>user\nWhat is {a}+{b}?<|im_end|>\n<|im_start|>assistant\nCALC: {a}+{b} = {a + b}. The answer is {a + b}.<|im_end|>"
    for a in range(0, 60, 3)
    for b in range(0, 60, 7)
]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    return build_tiny(
        tmp_path_factory.mktemp("tiny") / "model",
        CORPUS,
        vocab_size=320,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
    )


@pytest.fixture
async def engine(tiny_model_dir: Path) -> AsyncIterator[object]:
    from infra.engine import InferenceEngine

    eng = InferenceEngine.from_pretrained(tiny_model_dir, max_model_len=256)
    yield eng
    await eng.close()


@pytest.fixture
def chat_ids(engine: object) -> list[int]:
    ids = engine.tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": "What is 12+30?"}], add_generation_prompt=True, return_dict=False
    )
    return [int(i) for i in ids]
