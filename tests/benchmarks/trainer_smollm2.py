"""Training tokens/s on SmolLM2-135M-Instruct: Flywheel's torch backend beside a plain PyTorch loop.

Both sides train the same model (``trainer.models.smollm2.build_smollm2``) on the same batch: ``--batch``
rows of ``--seq`` tokens, a prompt of half the row and a response of the other half, in GRPO groups of
``--group`` rows that share their prompt (the way the trainer's batches arrive: a group's samples are
one prompt sampled G times). Flywheel's side is one GRPO step of :class:`TorchBackend` (LoRA:
:class:`trainer.lora.LoraPolicies`' adapter) on :class:`trainer.batching.Sample` rows, as the
trainer service calls it. The plain side is what a user writes with Hugging Face and PyTorch: the
padded batch through the model, the log-probs of the response tokens (fp32 log-softmax), the loss
``-(advantage * logp)`` averaged over response tokens, backward, gradient clipping at 1.0 and a
``torch.optim.AdamW`` step (full model, or the same peft ``LoraConfig``: rank 8, alpha 16, q_proj and
v_proj). Each side applies the configuration the same way: ``bf16`` runs the forward under
``torch.autocast(bfloat16)`` with fp32 trained weights (LoRA: the frozen base stored in bf16), and
``ckpt`` turns on transformers' non-reentrant gradient checkpointing.

Configurations: full / LoRA × fp32 / bf16 × checkpointing off / on. Per configuration and side: one
warm-up step, then ``--steps`` timed steps; ``--repeats`` repeats, interleaved (each repeat builds every
configuration's two sides afresh, and alternates which side goes first), medians reported.

Figures: ``<config>_flywheel_tok_s`` and ``<config>_plain_tok_s`` (tokens of the batch, prompt and
response, per second of training step), and ``<config>_ratio``, flywheel / plain (the median over
repeats of each repeat's ratio). Goals: every ratio ≥ 1.0.

    python tests/benchmarks/trainer_smollm2.py [--json] [--batch 4] [--seq 256] [--group 4] [--steps 3]
        [--repeats 3] [--device cpu|cuda] [--configs full_fp32 lora_bf16_ckpt ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from trainer.batching import BatchStats, Sample, TrainBatch
from trainer.config import AlgorithmConfig, LoraOptions, ModelOptions

CONFIGS = [
    f"{kind}_{dtype}{'_ckpt' if ckpt else ''}"
    for kind in ("full", "lora")
    for dtype in ("fp32", "bf16")
    for ckpt in (False, True)
]
ALGO = AlgorithmConfig()  # the trainer's defaults: one epoch, no KL, lr 1e-4, grad clip 1.0
LORA = LoraOptions()  # rank 8, alpha 16, q_proj + v_proj, lr 2e-4


def _options(config: str) -> ModelOptions:
    return ModelOptions(
        dtype="bfloat16" if "_bf16" in config else "float32", gradient_checkpointing=config.endswith("_ckpt")
    )


def make_batch(batch: int, seq: int, group: int, vocab: int, seed: int = 0) -> TrainBatch:
    """``batch`` rows of ``seq`` tokens, groups of ``group`` rows sharing a prompt, ±1 advantages."""
    import random

    rng = random.Random(seed)
    prompt_len, response_len = seq // 2, seq - seq // 2
    samples: list[Sample] = []
    for g in range((batch + group - 1) // group):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        for i in range(min(group, batch - g * group)):
            samples.append(
                Sample(
                    list(prompt),
                    [rng.randrange(vocab) for _ in range(response_len)],
                    [1] * response_len,
                    [-2.0] * response_len,
                    rng.choice([-1.0, 1.0]),
                    1 / (batch * response_len),
                    f"e{g}-{i}",
                )
            )
    return TrainBatch(samples, BatchStats(), [])


def _load(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def flywheel_step(model_dir: Path, config: str, batch: TrainBatch, device: str) -> Callable[[], None]:
    """One GRPO step of Flywheel's backend, built as the trainer builds it."""
    options = _options(config)
    if config.startswith("lora"):
        from trainer.lora import LoraPolicies

        adapter = LoraPolicies(
            _load(model_dir), ["bench"], ALGO, LORA, device=device, model_options=options
        ).adapters["bench"]

        def lora_step() -> None:
            adapter.train_step(batch)

        return lora_step
    from trainer.backends.torch_backend import TorchBackend

    backend = TorchBackend(_load(model_dir), ALGO, device=device, model_options=options)

    def full_step() -> None:
        backend.train_step(batch)

    return full_step


def plain_step(model_dir: Path, config: str, batch: TrainBatch, device: str) -> Callable[[], None]:
    """One step of the loop a user writes with transformers, peft and torch (the module docstring)."""
    options = _options(config)
    dev = torch.device(device)
    model = _load(model_dir)
    lr = ALGO.learning_rate
    if config.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        conf = LoraConfig(
            r=LORA.rank, lora_alpha=LORA.alpha, lora_dropout=0.0, target_modules=list(LORA.target_modules)
        )
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, conf)
        lr = LORA.learning_rate
        if options.dtype == "bfloat16":  # the frozen base in bf16, the adapters in fp32
            for name, param in model.named_parameters():
                if "lora_" not in name:
                    param.data = param.data.to(torch.bfloat16)
    model.to(dev).train()
    if options.gradient_checkpointing:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        base.config.use_cache = False
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr)
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)
    ids = torch.tensor(
        [
            s.prompt_ids + s.response_ids + [0] * (width - len(s.prompt_ids) - len(s.response_ids))
            for s in batch.samples
        ]
    ).to(dev)
    attn = (
        (
            torch.arange(width)[None, :]
            < torch.tensor([[len(s.prompt_ids) + len(s.response_ids)] for s in batch.samples])
        )
        .long()
        .to(dev)
    )
    mask = torch.zeros(len(batch.samples), width - 1)
    for row, s in enumerate(batch.samples):
        mask[row, len(s.prompt_ids) - 1 : len(s.prompt_ids) - 1 + len(s.response_ids)] = 1.0
    mask = mask.to(dev)
    adv = torch.tensor([s.advantage for s in batch.samples]).to(dev)[:, None]
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=options.dtype == "bfloat16")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(adv * logp * mask).sum() / mask.sum()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()

    return step


def _time(step: Callable[[], None], steps: int, device: str) -> float:
    """Seconds per step: one warm-up step, then the median of ``steps`` timed steps."""

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(args: argparse.Namespace, model_dir: Path) -> dict[str, float]:
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    batch = make_batch(args.batch, args.seq, args.group, vocab)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)
    sides = {"flywheel": flywheel_step, "plain": plain_step}
    runs: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for config in args.configs:
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for side in order:
                torch.manual_seed(0)
                step = sides[side](model_dir, config, batch, args.device)
                runs.setdefault((config, side), []).append(_time(step, args.steps, args.device))
                del step
                print(f"# repeat {repeat} {config} {side}: {runs[(config, side)][-1]:.3f} s", file=sys.stderr)
    figures: dict[str, float] = {"batch_tokens": float(tokens), "threads": float(torch.get_num_threads())}
    for config in args.configs:
        fly, plain = runs[(config, "flywheel")], runs[(config, "plain")]
        figures[f"{config}_flywheel_tok_s"] = round(tokens / statistics.median(fly), 1)
        figures[f"{config}_plain_tok_s"] = round(tokens / statistics.median(plain), 1)
        figures[f"{config}_ratio"] = round(
            statistics.median(p / f for f, p in zip(fly, plain, strict=True)), 3
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    parser.add_argument("--seq", type=int, default=256, help="tokens per row (half prompt, half response)")
    parser.add_argument("--group", type=int, default=4, help="rows per GRPO group (sharing their prompt)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per configuration")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: build_smollm2()'s directory")
    args = parser.parse_args()

    from infra.logging import configure_logging
    from trainer.models.smollm2 import build_smollm2

    configure_logging("WARNING", json=False)
    model_dir = args.model_dir or build_smollm2()
    figures = measure(args, model_dir)
    goals = {
        f"{c}_ratio": "≥ 1.0: " + ("pass" if figures[f"{c}_ratio"] >= 1.0 else "FAIL") for c in args.configs
    }
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    for name, value in figures.items():
        print(f"{name:<32} {value:>12}  {goals.get(name, '')}")
    print(
        f"(SmolLM2-135M-Instruct on {args.device}, {os.cpu_count()} cores; {args.batch} rows × {args.seq} tokens,"
        f" groups of {args.group}; medians of {args.steps} steps × {args.repeats} interleaved repeats)"
    )


if __name__ == "__main__":
    main()
