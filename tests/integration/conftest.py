"""Fixtures shared by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = [
    f"<|im_start|>user\\nWhat is {a}+{b}?<|im_end|>\\n<|im_start|>assistant\\nThe answer is {a + b}.<|im_end|>"
    for a in range(0, 40, 3)
    for b in range(0, 40, 7)
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer tiny Qwen2 with a ChatML tokenizer, built once per module."""
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
