"""The demo's warm-start SFT step: one microbatch per step (padded to the longest sample) against
length-sorted microbatches of at most ``SFT_TOKEN_BUDGET`` padded tokens.

Both give the same gradient (``tests/unit/trainer/test_trainer_backend.py::
test_microbatching_gives_the_same_gradient``); the smaller budget pads less. Measured on each demo agent's
own demonstrations (the calculator's and the SQL agent's, tokenised by a tokenizer trained here), batches
of the demo's size, the two settings interleaved, medians.

Figures: ``<agent>_ms_per_step_one_microbatch`` (baseline), ``<agent>_ms_per_step_budget``,
``<agent>_speedup`` = baseline / budget, and ``<agent>_padding_one_microbatch`` /
``<agent>_padding_budget``: the share of computed positions that are padding.

    flock /tmp/flywheel-cpu.lock python tests/benchmarks/warmstart.py [--json] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.demo.agents import demo_agent
from examples.demo.warmstart import SFT_TOKEN_BUDGET, _normalised, build_base, load_samples

GOALS = {"calc_speedup": "≥ 1.1", "sql_speedup": "≥ 1.2"}
ONE_MICROBATCH = 1 << 20  # any batch fits: the whole batch padded to its longest sample


def _measure(agent_name: str, steps: int, root: Path) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.backends.torch_backend import TorchBackend
    from trainer.config import AlgorithmConfig

    agent = demo_agent(agent_name, root / "cache")
    cfg = replace(agent.warm, demos=min(agent.warm.demos, 1000)) if agent.warm.demos else agent.warm
    base = build_base(cfg, root / agent_name, None, agent)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    samples = load_samples(cfg, tokenizer, root / agent_name / "samples.json", agent)
    rng = random.Random(0)
    batches = [_normalised(rng.sample(samples, cfg.sft_batch)) for _ in range(steps)]
    backends = {}
    for name, budget in (("one_microbatch", ONE_MICROBATCH), ("budget", SFT_TOKEN_BUDGET)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        backends[name] = TorchBackend(model, AlgorithmConfig(sft_learning_rate=1e-3, token_budget=budget))
    times: dict[str, list[float]] = {name: [] for name in backends}
    padding: dict[str, list[float]] = {name: [] for name in backends}
    for batch in batches:  # interleaved: a noisy stretch of the machine hits both
        for name, backend in backends.items():
            rows = backend._microbatches(batch)
            padded = sum(r.padded_tokens for r in rows)
            padding[name].append(1.0 - sum(r.real_tokens for r in rows) / padded)
            t = time.perf_counter()
            backend.sft_step(batch)
            times[name].append(time.perf_counter() - t)
    out: dict[str, float] = {}
    for name in backends:
        out[f"{agent_name}_ms_per_step_{name}"] = 1000 * statistics.median(times[name][1:])
        out[f"{agent_name}_padding_{name}"] = statistics.mean(padding[name])
    out[f"{agent_name}_speedup"] = (
        out[f"{agent_name}_ms_per_step_one_microbatch"] / out[f"{agent_name}_ms_per_step_budget"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for agent in ("calc", "sql"):
            figures.update(_measure(agent, args.steps, Path(tmp)))
    if args.json:
        print(json.dumps({"figures": {k: round(v, 4) for k, v in figures.items()}, "goals": GOALS}))
        return
    print(
        f"SFT step, batches of the demo's size, token budget {SFT_TOKEN_BUDGET} vs one microbatch (medians)"
    )
    print(f"{'agent':<6} {'one microbatch':>16} {'budget':>10} {'speedup':>8} {'padding':>16}")
    for agent in ("calc", "sql"):
        print(
            f"{agent:<6} {figures[f'{agent}_ms_per_step_one_microbatch']:>13.0f} ms"
            f" {figures[f'{agent}_ms_per_step_budget']:>7.0f} ms {figures[f'{agent}_speedup']:>7.2f}x"
            f" {100 * figures[f'{agent}_padding_one_microbatch']:>6.1f}% → {100 * figures[f'{agent}_padding_budget']:.1f}%"
        )
    print("goals:", ", ".join(f"{k} {v}" for k, v in GOALS.items()))


if __name__ == "__main__":
    main()
