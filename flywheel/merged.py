"""``flywheel export --merged``: one policy's trained adapter folded into the frozen base.

With a policy map, the adapter's checkpoint (under ``<trainer dir>/policies/<name>/checkpoints``) is
merged into the base with peft's ``merge_and_unload`` and written as one Hugging Face model directory
that ``from_pretrained`` loads with no ``peft``.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from trainer.checkpoints import CheckpointStore

MERGED_INFO = "flywheel_merged.json"


class MergeError(ValueError):
    """The policy, its version or the base cannot be found, or the output is in the way (one line)."""


@dataclass(frozen=True, slots=True)
class MergedReport:
    policy: str
    version: int
    base_model: str
    path: str
    seconds: float
    bytes: int

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "version": self.version,
            "base_model": self.base_model,
            "path": self.path,
            "seconds": round(self.seconds, 3),
            "bytes": self.bytes,
        }


def adapter_checkpoint(trainer_root: Path, policy: str, version: int | None = None) -> tuple[Path, int, str]:
    """The checkpoint directory of ``policy``'s adapter (its latest, or ``version``), its version and the
    base model it was trained over; :class:`MergeError` naming what exists when there is no such thing."""
    policies_dir = trainer_root / "policies"
    known = sorted(p.name for p in policies_dir.glob("*") if p.is_dir()) if policies_dir.is_dir() else []
    if policy not in known:
        have = (
            f"policies with checkpoints: {', '.join(known)}" if known else f"no adapter under {policies_dir}"
        )
        raise MergeError(f"unknown policy {policy!r} ({have})")
    store = CheckpointStore(policies_dir / policy)
    if version is None:
        info = store.latest()
    else:
        info = next((i for i in store.all() if i.meta.version == version), None)
    if info is None:
        versions = ", ".join(str(i.meta.version) for i in store.all()) or "none"
        wanted = "a checkpoint" if version is None else f"version {version}"
        raise MergeError(f"policy {policy!r} has no {wanted} (versions kept: {versions})")
    return info.path, info.meta.version, info.meta.base_model


def export_merged(
    trainer_root: Path,
    policy: str,
    output: Path,
    *,
    version: int | None = None,
    base_model: Path | None = None,
) -> MergedReport:
    """Write base + ``policy``'s adapter (latest, or ``version``) as one Hugging Face model directory.

    The base is the one the adapter's checkpoint names (or ``base_model``). The merge is done in float32
    (an adapter's update is small next to the weights it adds to) and the result saved in the base's own
    dtype, with the base's tokenizer and a ``flywheel_merged.json`` naming the policy, version and base.
    """
    path, found, recorded_base = adapter_checkpoint(trainer_root, policy, version)
    base = base_model or (Path(recorded_base) if recorded_base else None)
    if base is None or not (base / "config.json").is_file():
        raise MergeError(
            f"the base model {str(base) if base else '(not recorded)'} is not a Hugging Face model "
            "directory; name it with --model"
        )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise MergeError(f"{output} exists and is not an empty directory")
    t0 = time.perf_counter()
    # lazy: torch, peft and transformers load only for a merge, not with the export command
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    dtype = getattr(AutoConfig.from_pretrained(str(base)), "dtype", None)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    try:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing`` (trainer/lora.py)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = PeftModel.from_pretrained(model, str(path), adapter_name=policy)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise MergeError(f"cannot load adapter {path} over {base}: {exc}") from exc
    merged = peft_model.merge_and_unload()
    if isinstance(dtype, torch.dtype) and dtype != torch.float32:
        merged = merged.to(dtype)
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        merged.save_pretrained(str(partial))
        if (base / "tokenizer_config.json").is_file():
            AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(partial))
        info = {"policy": policy, "version": found, "base_model": str(base), "adapter": str(path)}
        (partial / MERGED_INFO).write_text(json.dumps(info, indent=1))
        if output.exists():
            output.rmdir()
        partial.replace(output)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    size = sum(f.stat().st_size for f in output.rglob("*") if f.is_file())
    return MergedReport(policy, found, str(base), str(output), time.perf_counter() - t0, size)
