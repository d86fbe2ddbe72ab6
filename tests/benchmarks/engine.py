"""Embedded engine throughput: tokens/s at batch 1, 8 and 32 on the demo's model.

The model is the demo's own base model: ``infra.application.demo.warmstart.build_base(WarmStartConfig())`` (its
sizes, tokenizer and initialisation; untrained, which changes no speed), built once into a cache, so a
change of the demo's model changes what is measured here too. The prompt is the calculator agent's
first call (``examples.calc_agent.agent.first_messages``).

Baseline, measured in the same run: Hugging Face ``model.generate`` (sampling, KV cache) on the same
model, prompt and token count, with the batch padded together as ``generate`` requires. The engine
runs the batch as concurrent requests (continuous batching), as the gateway would send them.

    python tests/benchmarks/engine.py            # table
    python tests/benchmarks/engine.py --json     # {"figures": ..., "goals": ...}

``measure_engine(batch_sizes)`` is importable (``tests/benchmarks/trainer.py`` uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

NEW_TOKENS = 64
CACHE = Path(os.environ.get("FLYWHEEL_CACHE", Path.home() / ".cache" / "flywheel")) / "bench-models" / "demo"
QUESTION = "What is 47 * 38?"


def demo_model_dir() -> Path:
    """The demo's base model, built from ``WarmStartConfig()`` (one source of truth) into a cache."""
    from infra.application.demo.warmstart import WarmStartConfig, build_base

    return build_base(WarmStartConfig(), CACHE)


def demo_model_label(model_dir: Path) -> str:
    """``hidden H, L layers, vocab V, P M parameters`` of the model in ``model_dir``."""
    import json

    from safetensors import safe_open

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    params = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:  # tied: stored once
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            params += _numel(f.get_slice(name).get_shape())
    return f"hidden {hidden}, {layers} layers, vocab {vocab}, {params / 1e6:.2f} M parameters"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def demo_prompt(tokenizer: object, question: str = QUESTION) -> list[int]:
    """The calculator agent's first call, rendered by the model's chat template."""
    from examples.calc_agent.agent import first_messages

    ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        first_messages(question), add_generation_prompt=True, return_dict=False
    )
    return [int(i) for i in ids]


def _threads(threads: int | None = None) -> int:
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


async def _engine_rates(model_dir: Path, batch_sizes: Sequence[int]) -> dict[int, float]:
    from trainer.engine import InferenceEngine, SamplingParams

    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=512)
    prompt = demo_prompt(engine.tokenizer)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, temperature=1.0)
    await engine.complete(prompt, SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    rates: dict[int, float] = {}
    try:
        for batch in batch_sizes:
            start = time.perf_counter()
            results = await asyncio.gather(*(engine.complete(prompt, params) for _ in range(batch)))
            elapsed = time.perf_counter() - start
            rates[batch] = sum(len(r.choices[0].token_ids) for r in results) / elapsed
    finally:
        await engine.close()
    return rates


def _hf_rates(model_dir: Path, batch_sizes: Sequence[int]) -> dict[int, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train(False)
    prompt = demo_prompt(tokenizer)
    rates: dict[int, float] = {}
    with torch.no_grad():
        model.generate(
            torch.tensor([prompt]), max_new_tokens=4, do_sample=True, pad_token_id=tokenizer.pad_token_id
        )
        for batch in batch_sizes:
            ids = torch.tensor([prompt] * batch)
            start = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=True,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
            )
            elapsed = time.perf_counter() - start
            rates[batch] = (out.shape[1] - ids.shape[1]) * batch / elapsed
    return rates


def measure_engine(
    batch_sizes: Sequence[int] = (1, 8), model_dir: Path | None = None, threads: int | None = None
) -> dict[str, float]:
    """Engine tokens/s per batch size: ``{"engine_tok_s_b1": ..., "engine_tok_s_b8": ...}``.

    Sets torch's thread count (default: all cores) for the process, as the engine would.
    """
    _threads(threads)
    rates = asyncio.run(_engine_rates(model_dir or demo_model_dir(), batch_sizes))
    return {f"engine_tok_s_b{b}": round(r, 1) for b, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = parser.parse_args()
    threads = _threads(args.threads)
    model_dir = demo_model_dir()
    engine = asyncio.run(_engine_rates(model_dir, args.batch))
    hf = _hf_rates(model_dir, args.batch)
    figures: dict[str, float] = {"threads": threads}
    for b in args.batch:
        figures[f"engine_tok_s_b{b}"] = round(engine[b], 1)
        figures[f"hf_generate_tok_s_b{b}"] = round(hf[b], 1)
        figures[f"engine_vs_hf_b{b}"] = round(engine[b] / hf[b], 2)
    if 1 in engine and 8 in engine:
        figures["engine_batching_gain_b8_vs_b1"] = round(engine[8] / engine[1], 2)
    goals = {
        "engine_tok_s_b1": "≥ 200",
        "engine_tok_s_b8": "≥ 1070",
        "engine_vs_hf_b1": "≥ 1.0",
        "engine_vs_hf_b8": "≥ 1.0",
    }
    if args.json:
        print(json.dumps({"figures": figures, "goals": {k: v for k, v in goals.items() if k in figures}}))
        return
    print(
        f"engine vs HF generate, demo model ({demo_model_label(model_dir)}), {NEW_TOKENS} new tokens, "
        f"{threads} threads"
    )
    print(f"{'batch':>5}  {'engine tok/s':>12}  {'HF generate tok/s':>17}  {'ratio':>5}")
    for b in args.batch:
        print(f"{b:>5}  {engine[b]:>12.1f}  {hf[b]:>17.1f}  {engine[b] / hf[b]:>5.2f}")
    if "engine_batching_gain_b8_vs_b1" in figures:
        print(f"batching gain (engine b8 / b1): {figures['engine_batching_gain_b8_vs_b1']:.2f}x")
    print("goals: " + ", ".join(f"{k} {v}" for k, v in goals.items()))


if __name__ == "__main__":
    main()
