"""Embedded engine throughput: tokens/s at batch 1, 8 and 32 on the demo's model.

The model is the demo's own base model: ``examples.demo.warmstart.build_base(WarmStartConfig())`` (its
sizes, tokenizer and initialisation; untrained, which changes no speed), built once into a cache, so a
change of the demo's model changes what is measured here too. The prompt is the calculator agent's
first call (``examples.demo_agents.calc_agent.agent.first_messages``).

Baseline, measured in the same run: Hugging Face ``model.generate`` (sampling, KV cache) on the same
model, prompt and token count, with the batch padded together as ``generate`` requires. The engine
runs the batch as concurrent requests (continuous batching), as the gateway would send them.

    python tests/benchmarks/engine.py            # table
    python tests/benchmarks/engine.py --json     # {"figures": ..., "goals": ...}
    python tests/benchmarks/engine.py --vllm     # vLLM next to the embedded engine, both over HTTP

``--vllm``: the same model served over HTTP twice, one after the other so neither shares the cores with
the other: the embedded engine as ``flywheel engine`` (``EngineProcess``) and a real vLLM
(``infra.engine.vllm_server``: its own environment, Flywheel's flags, fp32 and eager on the CPU).
Each gets the requests the gateway sends upstream: ``/v1/completions`` with the prompt's token ids,
``logprobs: 0`` and ``return_token_ids``, NEW_TOKENS forced by ``ignore_eos`` (the embedded engine
refuses ``min_tokens``), temperature 1. Figures per server: completion tokens/s with 1 request at a time
(``--latency-requests`` in a row) and with 16 concurrent (median of ``--repeats`` rounds), the p50 latency
of one request alone, and the seconds to load a new version through the trainer's own sink
(``HttpSink`` with the engine's admin token; ``VllmSink``: pause, reload from disk, reset the prefix
cache, label, resume), median of ``--loads`` loads alternating two weight files; ratios vLLM/embedded.
On the CPU, vLLM binds its worker to one core and keeps the other for its front end (its default);
the embedded engine runs ``--threads`` torch threads (default all cores) beside its HTTP server.

``measure_engine(batch_sizes)`` is importable (``tests/benchmarks/trainer.py`` uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if TYPE_CHECKING:
    import httpx

    from trainer.weights import WeightSink

NEW_TOKENS = 64
FLYWHEEL_CACHE = Path(os.environ.get("FLYWHEEL_CACHE", Path.home() / ".cache" / "flywheel"))
CACHE = FLYWHEEL_CACHE / "bench-models" / "demo"
LOGS = FLYWHEEL_CACHE / "bench-logs"  # servers' logs, kept after the run (an error names them)
QUESTION = "What is 47 * 38?"
SERVED = "policy"
SERVED_CONCURRENCY = (1, 16)


def demo_model_dir() -> Path:
    """The demo's base model, built from ``WarmStartConfig()`` (one source of truth) into a cache."""
    from examples.demo.warmstart import WarmStartConfig, build_base

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
    from examples.demo_agents.calc_agent.agent import first_messages

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
    from infra.engine import InferenceEngine, SamplingParams

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
    parser.add_argument("--vllm", action="store_true", help="vLLM next to the embedded engine, over HTTP")
    parser.add_argument("--repeats", type=int, default=3, help="--vllm: rounds of 16 concurrent requests")
    parser.add_argument("--latency-requests", type=int, default=8, help="--vllm: requests one at a time")
    parser.add_argument("--loads", type=int, default=4, help="--vllm: weight loads per server")
    args = parser.parse_args()
    if args.vllm:
        served_main(args)
        return
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


# ---------------------------------------------------------------------------------------------- --vllm
@dataclass(frozen=True, slots=True)
class Served:
    """One server's figures over HTTP."""

    start_s: float
    tok_s: dict[int, float]  # concurrency → completion tokens/s
    p50_latency_s: float
    load_s: float  # median seconds to load a new version through the trainer's sink


def _request(prompt: Sequence[int], max_tokens: int = NEW_TOKENS) -> dict[str, object]:
    """What the gateway sends upstream for a token-id completion: ids and logprobs asked for."""
    return {
        "model": SERVED,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
        "add_special_tokens": False,
    }


async def _complete(client: httpx.AsyncClient, url: str, prompt: Sequence[int], max_tokens: int) -> int:
    r = await client.post(url + "/v1/completions", json=_request(prompt, max_tokens))
    r.raise_for_status()
    tokens = len(r.json()["choices"][0]["token_ids"])
    if tokens != max_tokens:
        raise RuntimeError(f"{url} returned {tokens} tokens, asked for {max_tokens} with ignore_eos")
    return tokens


async def _served_figures(
    url: str, prompt: Sequence[int], sink: WeightSink, versions: Sequence[Path], args: argparse.Namespace
) -> tuple[dict[int, float], float, float]:
    """tokens/s per concurrency, p50 latency of one request, median seconds per weight load."""
    import httpx

    from trainer.weights import WeightUpdate

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        await _complete(client, url, prompt, 8)  # vLLM compiles a kernel on the first request with logprobs
        await asyncio.gather(*(_complete(client, url, prompt, NEW_TOKENS) for _ in range(16)))
        latencies: list[float] = []
        for _ in range(args.latency_requests):
            start = time.perf_counter()
            await _complete(client, url, prompt, NEW_TOKENS)
            latencies.append(time.perf_counter() - start)
        rates = {1: NEW_TOKENS * len(latencies) / sum(latencies)}
        for concurrency in SERVED_CONCURRENCY:
            if concurrency == 1:
                continue
            rounds: list[float] = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                done = await asyncio.gather(
                    *(_complete(client, url, prompt, NEW_TOKENS) for _ in range(concurrency))
                )
                rounds.append(sum(done) / (time.perf_counter() - start))
            rates[concurrency] = statistics.median(rounds)
        loads: list[float] = []
        for i in range(args.loads):
            path = versions[i % len(versions)]
            start = time.perf_counter()
            await sink.load(WeightUpdate(version=i + 1, state_dict=dict, path=path))
            loads.append(time.perf_counter() - start)
        await _complete(client, url, prompt, 8)  # it serves on the version it loaded last
    return rates, statistics.median(latencies), statistics.median(loads)


async def _measure_embedded(
    model_dir: Path, prompt: Sequence[int], versions: Sequence[Path], args: argparse.Namespace
) -> Served:
    from infra.engine.process import EngineProcess
    from trainer.weights import HttpSink

    log_path = LOGS / "engine-embedded.log"
    log_path.unlink(missing_ok=True)  # the process appends: this run's log only
    start = time.perf_counter()
    proc = await EngineProcess.start(
        model_dir,
        log_path=log_path,
        model_name=SERVED,
        max_num_seqs=max(SERVED_CONCURRENCY),
        threads=args.threads,
    )
    try:
        start_s = time.perf_counter() - start
        sink = HttpSink(proc.url, token=proc.admin_token)
        try:
            rates, p50, load = await _served_figures(proc.url, prompt, sink, versions, args)
        finally:
            await sink.aclose()
    finally:
        await proc.stop()
    return Served(start_s, rates, p50, load)


def _measure_vllm(
    model_dir: Path, prompt: Sequence[int], versions: Sequence[Path], args: argparse.Namespace
) -> Served:
    import socket

    from infra.engine.vllm_server import VllmLaunch, VllmServer
    from trainer.vllm_sink import VllmSink

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a free port: never a fixed one
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cfg = json.loads((model_dir / "config.json").read_text())
    launch = VllmLaunch(
        model=model_dir,
        served_model_name=SERVED,
        port=port,
        max_model_len=min(2048, int(cfg.get("max_position_embeddings", 2048))),
    )
    log_path = LOGS / "engine-vllm.log"
    log_path.unlink(missing_ok=True)
    start = time.perf_counter()
    server = VllmServer.start(launch, log_path=log_path)
    try:
        start_s = time.perf_counter() - start

        async def measure() -> tuple[dict[int, float], float, float]:
            sink = VllmSink(server.url)
            try:
                return await _served_figures(server.url, prompt, sink, versions, args)
            finally:
                await sink.aclose()

        rates, p50, load = asyncio.run(measure())
    finally:
        server.stop()
    return Served(start_s, rates, p50, load)


def _write_versions(model_dir: Path, out: Path) -> list[Path]:
    """Two weight files a trainer could have exported: the model's own and a perturbed copy (so every
    load replaces the served weights with different ones)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 1e-3 * torch.randn(v.shape, generator=generator, dtype=v.dtype) if v.is_floating_point() else v
        for k, v in tensors.items()
    }
    paths = []
    for name, state in (("v-perturbed", perturbed), ("v-base", tensors)):
        (out / name).mkdir(parents=True)
        save_file(state, str(out / name / "model.safetensors"), metadata={"format": "pt"})
        paths.append(out / name / "model.safetensors")
    return paths


def served_main(args: argparse.Namespace) -> None:
    """``--vllm``: the embedded engine, then vLLM, each over HTTP on the demo's model."""
    from transformers import AutoTokenizer

    model_dir = demo_model_dir()
    prompt = demo_prompt(AutoTokenizer.from_pretrained(model_dir))
    threads = args.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="flywheel-engine-bench-") as tmp:
        versions = _write_versions(model_dir, Path(tmp))
        embedded = asyncio.run(_measure_embedded(model_dir, prompt, versions, args))
        vllm = _measure_vllm(model_dir, prompt, versions, args)
    figures: dict[str, float] = {"engine_threads": threads}
    rows: list[tuple[str, str, float, float]] = []
    for c in SERVED_CONCURRENCY:
        rows.append((f"tok_s_c{c}", f"tok/s, {c} concurrent", embedded.tok_s[c], vllm.tok_s[c]))
    rows.append(
        (
            "p50_latency_s",
            f"p50 latency, one request of {NEW_TOKENS} (s)",
            embedded.p50_latency_s,
            vllm.p50_latency_s,
        )
    )
    rows.append(("load_s", "load a new version (s)", embedded.load_s, vllm.load_s))
    rows.append(("start_s", "start-up to /health (s)", embedded.start_s, vllm.start_s))
    for key, _, e, v in rows:
        figures[f"embedded_{key}"] = round(e, 3)
        figures[f"vllm_{key}"] = round(v, 3)
        figures[f"vllm_vs_embedded_{key}"] = round(v / e, 2)
    if args.json:
        print(json.dumps({"figures": figures, "goals": {}}))
        return
    print(
        f"vLLM vs embedded engine over HTTP, demo model ({demo_model_label(model_dir)}), {NEW_TOKENS} new "
        f"tokens per request (token-id completions with logprobs, as the gateway sends them); embedded "
        f"engine {threads} threads, vLLM's worker on one core (its CPU default)"
    )
    print(f"{'':<36}  {'embedded':>9}  {'vLLM':>9}  {'vLLM/embedded':>13}")
    for _, label, e, v in rows:
        print(f"{label:<36}  {e:>9.3f}  {v:>9.3f}  {v / e:>13.2f}")
    print("goals: none (a comparison, both measured in this run)")


if __name__ == "__main__":
    main()
