"""Reading and checking new weights before they touch the serving model.

A weight update is all-or-nothing: the tensors are read and checked (every parameter present, shapes
equal, values finite) before a single parameter is overwritten, and the copy itself happens between
two decoding steps on the engine's thread, so no step ever sees half an update. Anything wrong raises
``WeightLoadError`` and the old weights keep serving.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn


class WeightLoadError(RuntimeError):
    """New weights could not be read or do not fit the model; the previous version is still serving."""

    def __init__(self, message: str, *, version: int | None = None, source: str | None = None) -> None:
        super().__init__(message)
        self.version = version
        self.source = source


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a ``save_pretrained`` directory (``*.safetensors``, else ``*.bin``) or one file."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.bin")) or sorted(p.glob("*.pt"))
        if not files:
            raise WeightLoadError(f"no *.safetensors, *.bin or *.pt files in {p}", source=str(p))
    elif p.is_file():
        files = [p]
    else:
        raise WeightLoadError(f"weights path {p} does not exist", source=str(p))
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                part = load_file(str(file))
            else:
                loaded = torch.load(str(file), map_location="cpu", weights_only=True)
                if not isinstance(loaded, Mapping):
                    raise WeightLoadError(f"{file} does not hold a state dict", source=str(file))
                part = dict(loaded)
        except WeightLoadError:
            raise
        except Exception as exc:  # corrupt or truncated file: translate at the boundary
            raise WeightLoadError(f"cannot read {file}: {exc}", source=str(file)) from exc
        tensors.update(part)
    return tensors


def check_state_dict(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Match ``tensors`` to the model's parameters; returns name → tensor to copy, or raises."""
    params = dict(model.named_parameters())
    # Tied weights appear once in named_parameters; accept (and ignore) the alias if it is sent too.
    aliases = {name for name, _ in model.state_dict().items()} - set(params)
    unknown = sorted(set(tensors) - set(params) - aliases)
    if unknown:
        raise WeightLoadError(f"unexpected tensors not in the model: {', '.join(unknown[:5])}")
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise WeightLoadError(
            f"missing tensors: {', '.join(missing[:5])}" + (" …" if len(missing) > 5 else "")
        )
    plan: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        value = tensors[name]
        if not isinstance(value, torch.Tensor):
            raise WeightLoadError(f"{name} is not a tensor")
        if tuple(value.shape) != tuple(param.shape):
            raise WeightLoadError(
                f"{name} has shape {tuple(value.shape)}, the model needs {tuple(param.shape)}"
            )
        if not value.is_floating_point():
            raise WeightLoadError(f"{name} has dtype {value.dtype}, expected floating point")
        if not _all_finite(value):
            raise WeightLoadError(f"{name} contains NaN or infinite values")
        plan[name] = value
    return plan


def _all_finite(value: torch.Tensor) -> bool:
    """Exactly ``isfinite(value).all()``, faster in the common case.

    A NaN or an infinity anywhere makes the sum NaN or infinite, so a finite sum proves every element
    finite. Only a non-finite sum (a bad value, or finite values whose sum overflows) pays for the
    element-wise check, which is slow on the CPU (most of a weight load: docs/results/tuning.md).
    """
    if bool(torch.isfinite(value.sum())):
        return True
    return bool(torch.isfinite(value).all())


@torch.no_grad()
def apply_state_dict(model: nn.Module, plan: Mapping[str, torch.Tensor]) -> None:
    """Copy checked tensors into the model's parameters in place (dtype converted)."""
    params = dict(model.named_parameters())
    for name, value in plan.items():
        params[name].copy_(value)
