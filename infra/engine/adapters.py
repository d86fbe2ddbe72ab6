"""LoRA adapters served over the base: any number, chosen per request, each loaded on its own.

An adapter is what ``peft`` saves (``adapter_config.json`` + ``adapter_model.safetensors``, the format
the trainer exports, :mod:`trainer.lora`, and vLLM's ``/v1/load_lora_adapter`` reads): for a projection
``W`` of layer ``i`` a pair ``A`` [r, in], ``B`` [out, r], and the layer computes
``W x + (alpha / r) · B A x`` (Hu et al. 2021, "LoRA", eq. 3; rsLoRA's ``alpha / sqrt(r)`` when the config
says ``use_rslora``).

The runner (:mod:`infra.engine.runner`) keeps the base weights untouched and adds each row's own
adapter delta after every adapted projection, so one batched step serves requests of several adapters
and of the base side by side. Loading a version of one adapter replaces that adapter's tensors between
two steps and touches nothing else: requests of the other adapters and of the base keep decoding.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from infra.engine.weight_loading import WeightLoadError, _all_finite

# peft's key for one projection's factor: "...layers.3.self_attn.q_proj.lora_A.weight" (an adapter name
# may sit before ".weight" in a model's own state dict: "lora_A.writer.weight")
_KEY = re.compile(
    r"layers\.(\d+)\.(?:self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    r"\.lora_([AB])(?:\.[^.]+)?\.weight$"
)
PROJECTIONS = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}


@dataclass(frozen=True)
class Adapter:
    """One adapter's factors, checked against the model: (layer, projection) → (A, B·scaling)."""

    name: str
    version: int
    rank: int
    scaling: float
    factors: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(
            a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.factors.values()
        )


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], float, int]:
    """A peft adapter directory → (tensors, scaling, rank); raises :class:`WeightLoadError`."""
    p = Path(path)
    config_file = p / "adapter_config.json"
    weights = p / "adapter_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise WeightLoadError(f"{p} is not a LoRA adapter (adapter_config.json + adapter_model.safetensors)")
    try:
        config = json.loads(config_file.read_text())
        rank = int(config["r"])
        alpha = float(config.get("lora_alpha", rank))
        tensors = load_file(str(weights))
    except WeightLoadError:
        raise
    except Exception as exc:  # a torn or foreign file: translated at the boundary
        raise WeightLoadError(f"cannot read the adapter in {p}: {exc}", source=str(p)) from exc
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise WeightLoadError(f"{p}: per-module ranks (rank_pattern/alpha_pattern) are not supported")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return tensors, scaling, rank


def check_adapter(
    name: str,
    version: int,
    tensors: Mapping[str, torch.Tensor],
    scaling: float,
    shapes: Mapping[tuple[int, str], tuple[int, int]],
    dtype: torch.dtype,
) -> Adapter:
    """Match peft's tensors to the model's projections (``shapes``: (layer, proj) → (in, out))."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        m = _KEY.search(key)
        if m is None:
            raise WeightLoadError(f"adapter {name}: {key} is not a LoRA factor of a supported projection")
        halves.setdefault((int(m.group(1)), PROJECTIONS[m.group(2)]), {})[m.group(3)] = value
    if not halves:
        raise WeightLoadError(f"adapter {name} holds no LoRA factors")
    factors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    rank = 0
    for where, pair in halves.items():
        if where not in shapes:
            raise WeightLoadError(f"adapter {name}: layer {where[0]} has no projection {where[1]}")
        if set(pair) != {"A", "B"}:
            raise WeightLoadError(f"adapter {name}: layer {where[0]} {where[1]} lacks lora_A or lora_B")
        a, b = pair["A"], pair["B"]
        d_in, d_out = shapes[where]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != d_in or b.shape != (d_out, r):
            raise WeightLoadError(
                f"adapter {name}: layer {where[0]} {where[1]} has A {tuple(a.shape)}, B {tuple(b.shape)}; "
                f"the model needs A [r, {d_in}], B [{d_out}, r]"
            )
        if not (_all_finite(a) and _all_finite(b)):
            raise WeightLoadError(f"adapter {name}: layer {where[0]} {where[1]} has NaN or infinite values")
        rank = max(rank, r)
        # B is pre-scaled once here, so a step pays two matmuls per adapted projection and nothing more
        factors[where] = (a.to(dtype).contiguous(), (b.float() * scaling).to(dtype).contiguous())
    return Adapter(name, version, rank, scaling, factors)


def add_deltas(
    out: torch.Tensor,
    x: torch.Tensor,
    where: tuple[int, str],
    rows: list[tuple[torch.Tensor, Adapter]],
) -> torch.Tensor:
    """``out`` (a projection's output) plus each row group's adapter delta ``x A^T (sB)^T``."""
    for index, adapter in rows:
        pair = adapter.factors.get(where)
        if pair is None:
            continue
        a, b = pair
        out[index] += (x[index] @ a.T) @ b.T
    return out
