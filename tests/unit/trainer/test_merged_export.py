"""``flywheel export --merged``: one policy's adapter folded into the base as one Hugging Face directory.

A tiny Qwen2 saved as the base, two adapters over it (peft, B made non-zero so they change the output),
checkpointed the way the trainer does (``<trainer dir>/policies/<name>/checkpoints/vNNNNNN``); the merged
directory loads with ``AutoModelForCausalLM.from_pretrained`` and gives peft's logits (base + adapter),
for the latest version and for an older one; an unknown policy or version is a one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flywheel.cli.main import app
from trainer.checkpoints import CheckpointMeta, CheckpointStore
from trainer.config import AlgorithmConfig, LoraOptions
from trainer.lora import LoraPolicies, load_policies

from .helpers import tiny_model

pytestmark = pytest.mark.timeout(180)

PROMPT = torch.tensor([[5, 9, 2, 7, 11, 3]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(PROMPT).logits[0].float()
    return logits


def _perturb(policies: LoraPolicies, name: str, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in policies.model.named_parameters():
            if f"lora_B.{name}." in n:
                p.normal_(0, 0.5)


def _checkpoint(policies: LoraPolicies, root: Path, name: str, version: int, base: Path) -> None:
    adapter = policies.adapters[name]
    meta = CheckpointMeta(version=version, step=version, model=name, base_model=str(base))
    CheckpointStore(root / "policies" / name).save(meta, adapter.save_checkpoint)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """A base directory, a trainer directory with writer v1, v2 and rewriter v1, and peft's logits."""
    tmp = tmp_path_factory.mktemp("merged")
    base = tmp / "base"
    tiny_model().save_pretrained(str(base))
    root = tmp / "trainer"
    options = LoraOptions(target_modules=("q_proj", "v_proj", "down_proj"))
    policies = load_policies(base, ["writer", "rewriter"], AlgorithmConfig(), options)
    want: dict[str, torch.Tensor] = {}
    with policies.model.disable_adapter():
        want["base"] = _logits(policies.model)
    for name, version, seed in (("writer", 1, 1), ("writer", 2, 2), ("rewriter", 1, 3)):
        _perturb(policies, name, seed)
        _checkpoint(policies, root, name, version, base)
        policies.model.set_adapter(name)
        want[f"{name}@{version}"] = _logits(policies.model)
    return base, root, want


def test_the_merged_model_gives_peft_logits_for_base_plus_adapter(
    trained: tuple[Path, Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    _, root, want = trained
    runner = CliRunner()
    out = tmp_path / "writer-merged"
    result = runner.invoke(
        app, ["export", "--merged", "--policy", "writer", "--dir", str(root), "-o", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["policy"], report["version"]) == ("writer", 2)
    assert json.loads((out / "flywheel_merged.json").read_text())["version"] == 2
    assert not any("adapter" in p.name for p in out.iterdir() if p.name != "flywheel_merged.json")
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    assert not any("lora_" in n for n, _ in merged.named_parameters())  # a plain model: no peft inside
    got = _logits(merged)
    assert torch.allclose(got, want["writer@2"], atol=1e-4), (got - want["writer@2"]).abs().max()
    assert not torch.allclose(got, want["base"], atol=1e-2)  # the adapter is in it

    older = tmp_path / "writer-v1"
    result = runner.invoke(
        app,
        ["export", "--merged", "--policy", "writer", "--version", "1", "--dir", str(root), "-o", str(older)],
    )
    assert result.exit_code == 0, result.output
    assert "writer v1 merged" in result.output
    got = _logits(AutoModelForCausalLM.from_pretrained(str(older)))
    assert torch.allclose(got, want["writer@1"], atol=1e-4)
    assert not torch.allclose(got, want["writer@2"], atol=1e-2)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--policy", "critic"], 1, "unknown policy 'critic' (policies with checkpoints: rewriter, writer)"),
        (
            ["--policy", "writer", "--version", "7"],
            1,
            "policy 'writer' has no version 7 (versions kept: 1, 2)",
        ),
        (["--policy", "writer", "--version", "two"], 2, "--version must be a positive whole number"),
        ([], 2, "--merged needs --policy NAME"),
    ],
)
def test_an_unknown_policy_or_version_is_a_one_line_error(
    trained: tuple[Path, Path, dict[str, torch.Tensor]],
    tmp_path: Path,
    args: list[str],
    code: int,
    message: str,
) -> None:
    _, root, _ = trained
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", "--merged", *args, "--dir", str(root), "-o", str(out)])
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert not out.exists()
