"""Other policies' latency while one policy's adapter is updated: A's p99 during B's updates vs without.

The embedded stack (gateway, engine, bus; no trainer) on the demo's base model (``engine.py``'s
``demo_model_dir``) with ``FLYWHEEL_POLICIES=alpha,beta`` (A and B): two LoRA adapters over the same
base, both loaded into the embedded engine (peft's defaults from ``trainer.config.LoraOptions``, their
``B`` factors made non-zero as training would). Steady open-loop traffic (Poisson arrivals, latency
counted from each request's scheduled arrival) of chat calls through the gateway to A and to B, each on
episodes of its own, for ``--phase-s`` seconds without updates, then for as long while B's adapter is
updated every ``--update-every`` seconds through the trainer's own protocol
(``trainer.weights.WeightSync`` with ``InProcessAdapterSink``: WeightUpdateRequested for adapter beta →
the gateway drains and pauses beta's calls → the engine swaps beta's tensors between two steps →
WeightsActivated → beta's calls resume), alternating two exported versions. The pair of phases runs
``--rounds`` times; each figure is the median of its per-round values, so a difference is never between
two distant moments of a shared machine.

    python tests/benchmarks/policies.py [--json] [--rounds 3] [--phase-s 30] [--rate-a 8] [--rate-b 4]

Figures: ``a_p99_ms_idle`` / ``a_p99_ms_updates`` and their ratio ``a_p99_ratio_updates_vs_idle`` (the
goal: ≤ 1.5, an update of one adapter does not stall the others), p50s likewise; B's own pause: the
update's ``b_update_total_ms`` (drain + load + activation: the longest a b call is held) and its parts,
and ``b_p99_ms_updates`` beside ``b_p99_ms_idle``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.engine import QUESTION, demo_model_dir

MAX_TOKENS = 16
EPISODES = 32
GOALS = {"a_p99_ratio_updates_vs_idle": "≤ 1.5"}


def p99(xs: Sequence[float]) -> float:
    """The nearest-rank 99th percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def build_adapters(model_dir: Path, out: Path, versions: int = 2) -> dict[str, list[Path]]:
    """Exported peft directories: ``versions`` of adapter a and of adapter b, each with non-zero ``B``."""
    import torch

    from trainer.config import AlgorithmConfig, LoraOptions
    from trainer.lora import load_policies

    policies = load_policies(model_dir, ["alpha", "beta"], AlgorithmConfig(), LoraOptions(), torch_threads=1)
    paths: dict[str, list[Path]] = {"alpha": [], "beta": []}
    for v in range(1, versions + 1):
        with torch.no_grad():
            for n, p in policies.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(v))
        for name in ("alpha", "beta"):
            paths[name].append(policies.adapters[name].export_weights(out / f"{name}-v{v}"))
    return paths


async def open_loop(
    urls: Sequence[str], model: str, rate: float, duration_s: float, seed: int
) -> list[tuple[float, float]]:
    """Poisson arrivals at ``rate``/s for ``duration_s``: (scheduled arrival, latency s) of each call."""
    import httpx

    rng = random.Random(seed)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
    }
    out: list[tuple[float, float]] = []
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=64)) as client:

        async def one(url: str, at: float) -> None:
            r = await client.post(url, json=body)
            if r.status_code != 200:
                errors.append(f"{r.status_code}: {r.text[:200]}")
            out.append((at, time.perf_counter() - at))

        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        at = start
        i = 0
        while True:
            at += rng.expovariate(rate)
            if at - start > duration_s:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(urls[i % len(urls)], at)))
            i += 1
        await asyncio.gather(*tasks)
    if errors:
        raise RuntimeError(f"{len(errors)} calls failed, first: {errors[0]}")
    return out


async def measure(args: argparse.Namespace) -> dict[str, float]:
    import httpx

    from flywheel.stack import EmbeddedStack, StackSettings
    from infra.bus.base import Message
    from schemas import CONTROL, InferenceDrained, InferenceResumed
    from trainer.weights import InProcessAdapterSink, UpdateResult, WeightSync, WeightUpdate

    model_dir = demo_model_dir()
    with tempfile.TemporaryDirectory(prefix="bench-policies-") as tmp:
        adapters = await asyncio.to_thread(build_adapters, model_dir, Path(tmp) / "adapters")
        settings = StackSettings(
            data_dir=Path(tmp) / "stack",
            policies="alpha,beta",
            run_trainer=False,
            run_worker=False,
            record_events=False,
            gateway_port=0,
        )
        async with EmbeddedStack(settings, model_dir=model_dir) as stack:
            assert stack.engine is not None and stack.bus is not None
            for name in ("alpha", "beta"):
                await stack.engine.load_adapter(name, adapters[name][0], 1)
            sync = WeightSync(
                stack.bus,
                [InProcessAdapterSink(stack.engine.load_adapter, "beta", name="embedded-engine")],
                model=settings.model,
                adapter="beta",
                expected_gateways=1,
            )

            async def on_control(msg: Message) -> None:
                if isinstance(msg.event, InferenceDrained | InferenceResumed):
                    await sync.observe(msg.event)

            sub = await stack.bus.subscribe(CONTROL, "bench-policies", on_control, from_beginning=False)
            admin = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}
            urls: list[str] = []
            async with httpx.AsyncClient(headers=admin) as c:
                for _ in range(EPISODES):
                    r = await c.post(f"{stack.gateway_url}/admin/episodes")
                    r.raise_for_status()
                    urls.append(r.json()["base_url"] + "/chat/completions")
            await open_loop(urls, "alpha", args.rate_a, 3.0, seed=0)  # warm-up: the engine's first steps
            versions = iter(range(2, 1_000_000))

            async def updater(stop: asyncio.Event, results: list[UpdateResult]) -> None:
                """B's adapter updated every ``--update-every`` s, alternating its exported versions."""
                while not stop.is_set():
                    try:
                        await asyncio.wait_for(stop.wait(), args.update_every)
                    except TimeoutError:
                        v = next(versions)
                        path = adapters["beta"][v % len(adapters["beta"])]
                        results.append(await sync.update(WeightUpdate(v, dict, path)))

            rows: list[dict[str, float]] = []
            for rnd in range(args.rounds):
                row: dict[str, float] = {}
                for phase in ("idle", "updates"):
                    results: list[UpdateResult] = []
                    stop = asyncio.Event()
                    task = asyncio.create_task(updater(stop, results)) if phase == "updates" else None
                    seed = 1000 * rnd + (phase == "updates")
                    half = len(urls) // 2  # each policy's calls on episodes of its own
                    a, b = await asyncio.gather(
                        open_loop(urls[:half], "alpha", args.rate_a, args.phase_s, seed),
                        open_loop(urls[half:], "beta", args.rate_b, args.phase_s, seed + 500),
                    )
                    stop.set()
                    if task is not None:
                        await task
                    for who, xs in (("a", a), ("b", b)):
                        lat = [s * 1000 for _, s in xs]
                        row[f"{who}_p99_ms_{phase}"] = p99(lat)
                        row[f"{who}_p50_ms_{phase}"] = statistics.median(lat)
                        row[f"{who}_calls_{phase}"] = len(lat)
                    if results:
                        if not all(r.activated for r in results):
                            raise RuntimeError(f"an update failed: {[r.error for r in results if r.error]}")
                        row["b_updates"] = len(results)
                        row["b_update_total_ms"] = statistics.median(r.total_ms for r in results)
                        row["b_update_drain_ms"] = statistics.median(r.drain_ms for r in results)
                        row["b_update_load_ms"] = statistics.median(r.load_ms for r in results)
                        row["b_update_total_ms_max"] = max(r.total_ms for r in results)
                row["a_p99_ratio_updates_vs_idle"] = row["a_p99_ms_updates"] / row["a_p99_ms_idle"]
                row["a_p50_ratio_updates_vs_idle"] = row["a_p50_ms_updates"] / row["a_p50_ms_idle"]
                if not args.json:
                    print(f"round {rnd + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(row.items())))
                rows.append(row)
            await sub.stop()
            served = stack.engine.adapters
            await sync.aclose()
    figures = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    figures["rounds"] = len(rows)
    figures["b_version_served"] = float(served["beta"])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds of each phase")
    parser.add_argument("--rate-a", type=float, default=8.0, help="policy A's calls per second")
    parser.add_argument("--rate-b", type=float, default=4.0, help="policy B's calls per second")
    parser.add_argument("--update-every", type=float, default=1.0, help="seconds between B's updates")
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    goals: dict[str, Any] = {k: v for k, v in GOALS.items() if k in figures}
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    print(
        f"two adapters over the demo model, A {args.rate_a}/s and B {args.rate_b}/s, {MAX_TOKENS} tokens, "
        f"B updated every {args.update_every} s, {args.rounds} rounds of {args.phase_s} s per phase (medians)"
    )
    for key, value in figures.items():
        print(f"{key:<34}{value:>10.3f}")
    print("goals: " + ", ".join(f"{k} {v}" for k, v in goals.items()))


if __name__ == "__main__":
    main()
