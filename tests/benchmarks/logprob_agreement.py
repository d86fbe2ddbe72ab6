"""Training and inference agree: the trainer's logprobs of vLLM's sampled tokens against vLLM's own.

For the same weights, N calculator-agent first calls (``examples.demo_agents.calc_agent.agent.first_messages`` with
varied questions) go to a live vLLM (``infra.engine.vllm_server``: Flywheel's flags, so
``--logprobs-mode processed_logprobs``) as the gateway sends them: chat completions with ``logprobs``
and ``return_token_ids``, the temperature the agent asked for, nothing else. Each reply becomes the
``LLMCallRecorded`` the gateway would record (its ``temperature`` as ``gateway.recording.prepare.sampling_temperature``
reads it from the body sent) and the ``Transition`` the reward service assembles from it
(``reward_service.transitions.assemble``), whose ``temperature`` the ``Sample`` carries. The trainer then
scores exactly the ids vLLM returned (``prompt_token_ids`` + ``choices[0].token_ids``) with its own code
path: ``load_backend`` → ``TorchBackend._logprobs`` (the forward pass and ``trainer.loss.gather_logprobs``
that ``train_step`` reads, the logits divided by the sample's temperature), one row per sample as
``sequence_logprobs`` builds it.

Per response token Δ = trainer − vLLM; the importance ratio exp(Δ) is what the loss's truncated
importance sampling multiplies by (``tis_mean`` in a step's metrics). The N samples are cut into steps
of ``--batch`` samples, as the trainer would get them: ``ratio_mean`` is the median over steps of a
step's mean ratio, ``ratio_mean_worst`` the step mean farthest from 1, ``ratio_min``/``ratio_max`` over
every token; ``delta_mean``, ``abs_delta_mean`` and ``abs_delta_max`` over every token.

The ratio's mean is a weak check on its own: for tokens sampled from vLLM's distribution q, E_q[p/q] = 1
for *any* trainer distribution p, so a wrong temperature still averages near 1. ``delta_mean`` (an
estimate of −KL(q‖p)) and the per-token |Δ| and ratio extremes are what tell the two apart.

Temperature. vLLM's processed logprobs are those of the distribution it sampled from, softmax(logits/T),
and the trainer divides its logits by the call's recorded temperature, so they must agree at every T. At
T ≠ 1 the benchmark also reports the trainer with the temperature ignored (``noT``: every sample at 1, as
the trainer was before the temperature was recorded), showing what the division is worth.

Dtype. ``fp32``: vLLM serves fp32 (Flywheel's CPU default) and the trainer computes in fp32 (its only
mode). ``bf16``: the trainer's model cast to bfloat16 against the same fp32 server (logits still
softmaxed in fp32 as ``gather_logprobs`` does), and with ``--vllm-bf16`` also a second server started
with ``--dtype bfloat16`` (another 2–4 minutes on 2 cores), scored by the trainer in fp32 and bf16.

Model: the demo's (``demo_model_dir()``, the tiny Qwen2 the demo trains, untrained) or ``--smollm2``
(SmolLM2-135M-Instruct, ``flywheel model smollm2``), or ``--model DIR``.

    python tests/benchmarks/logprob_agreement.py                  # table
    python tests/benchmarks/logprob_agreement.py --json           # {"figures": ..., "goals": ...}
    python tests/benchmarks/logprob_agreement.py --smollm2 --vllm-bf16 --n 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.engine import LOGS, demo_model_dir, demo_model_label

if TYPE_CHECKING:
    from trainer.backends.torch_backend import TorchBackend
    from trainer.batching import Sample

SERVED = "policy"
TEMPERATURES = (1.0, 0.7)
RATIO_GOAL = 0.01  # fp32, at every temperature: the mean ratio within 1 ± this


@dataclass(frozen=True, slots=True)
class Call:
    """One sampled completion as vLLM returned it (what the gateway records)."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # vLLM's processed logprob of each token in token_ids
    temperature: float  # what the gateway records (gateway.recording.prepare.sampling_temperature)


@dataclass(frozen=True, slots=True)
class Agreement:
    """Trainer against vLLM over one set of calls."""

    tokens: int
    delta_mean: float  # signed: an estimate of -KL(vLLM || trainer), ≤ 0 up to noise
    abs_delta_mean: float
    abs_delta_max: float
    ratio_mean: float  # median over steps of a step's mean token ratio
    ratio_mean_worst: float  # the step mean farthest from 1
    ratio_min: float
    ratio_max: float

    def figures(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}_delta_mean": round(self.delta_mean, 7),
            f"{prefix}_abs_delta_mean": round(self.abs_delta_mean, 7),
            f"{prefix}_abs_delta_max": round(self.abs_delta_max, 7),
            f"{prefix}_ratio_mean": round(self.ratio_mean, 6),
            f"{prefix}_ratio_mean_worst": round(self.ratio_mean_worst, 6),
            f"{prefix}_ratio_min": round(self.ratio_min, 6),
            f"{prefix}_ratio_max": round(self.ratio_max, 6),
        }


def questions(n: int, seed: int = 0) -> list[str]:
    """Varied arithmetic questions in the calc agent's task format."""
    rng = random.Random(seed)
    return [f"What is {rng.randint(2, 99)} {rng.choice('+-*')} {rng.randint(2, 99)}?" for _ in range(n)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def sample_calls(
    url: str, prompts: Sequence[str], temperature: float, max_tokens: int, seed: int
) -> list[Call]:
    """Every prompt sent at once, as concurrent agents would; seeded per request."""
    import httpx

    from examples.demo_agents.calc_agent.agent import first_messages
    from gateway.recording.prepare import sampling_temperature
    from schemas import UpstreamKind

    async def one(client: httpx.AsyncClient, i: int, question: str) -> Call:
        sent = {
            "model": SERVED,
            "messages": first_messages(question),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed + i,
            "logprobs": True,
            "return_token_ids": True,
        }
        r = await client.post(url + "/v1/chat/completions", json=sent)
        r.raise_for_status()
        body = r.json()
        choice = body["choices"][0]
        logprobs = [float(t["logprob"]) for t in choice["logprobs"]["content"]]
        token_ids = [int(t) for t in choice["token_ids"]]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(token_ids)} token ids but {len(logprobs)} logprobs")
        recorded = sampling_temperature(sent, UpstreamKind.vllm)
        assert recorded is not None
        return Call([int(t) for t in body["prompt_token_ids"]], token_ids, logprobs, recorded)

    async with httpx.AsyncClient(timeout=600.0) as client:
        return list(await asyncio.gather(*(one(client, i, q) for i, q in enumerate(prompts))))


def warm_up(url: str) -> float:
    """The first request with logprobs compiles a kernel (~25 s on the CPU): paid before measuring."""
    import httpx

    start = time.perf_counter()
    r = httpx.post(
        url + "/v1/chat/completions",
        json={
            "model": SERVED,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "logprobs": True,
        },
        timeout=600.0,
    )
    r.raise_for_status()
    return time.perf_counter() - start


def as_sample(call: Call) -> Sample:
    """The sample the trainer gets for ``call``: its event, the reward service's transition, the sample."""
    from reward_service.transitions import assemble
    from schemas import CallChoice, LLMCallRecorded, UpstreamKind
    from trainer.batching import Sample

    event = LLMCallRecorded(
        episode_id="bench",
        call_seq=0,
        call_id="bench-0",
        request="{}",
        upstream=UpstreamKind.vllm,
        token_faithful=True,
        prompt_token_ids=call.prompt_ids,
        choices=[CallChoice(index=0, token_ids=call.token_ids, logprobs=call.logprobs)],
        temperature=call.temperature,
    )
    [t] = assemble([event], reward=0.0).transitions
    return Sample(
        prompt_ids=t.prompt_ids,
        response_ids=t.response_ids,
        response_mask=t.response_mask,
        behaviour_logprobs=t.behaviour_logprobs,
        advantage=0.0,
        token_weight=1.0,
        episode_id="bench",
        temperature=t.temperature,
    )


def trainer_logprobs(backend: TorchBackend, call: Call, *, ignore_temperature: bool = False) -> list[float]:
    """The trainer's logprob of each of ``call``'s tokens, on its own path (as train_step runs it);
    ``ignore_temperature``: every sample at 1, as before the call's temperature was recorded."""
    import dataclasses

    import torch

    from trainer.backends.torch_backend import _Rows

    sample = as_sample(call)
    if ignore_temperature:
        sample = dataclasses.replace(sample, temperature=1.0)
    backend.model.eval()
    with torch.no_grad():
        rows = _Rows([sample], backend.pad_id, backend.device)
        logp = backend._logprobs(backend.model, rows)
    start = len(call.prompt_ids) - 1  # position t predicts token t + 1
    n = len(call.token_ids)
    return [float(x) for x in logp[0, start : start + n]]


def agreement(trainer: Sequence[Sequence[float]], calls: Sequence[Call], batch: int) -> Agreement:
    deltas = [
        [t - c for t, c in zip(ts, call.logprobs, strict=True)]
        for ts, call in zip(trainer, calls, strict=True)
    ]
    flat = [d for ds in deltas for d in ds]
    step_means: list[float] = []
    for i in range(0, len(deltas), batch):
        ratios = [math.exp(d) for ds in deltas[i : i + batch] for d in ds]
        if ratios:
            step_means.append(sum(ratios) / len(ratios))
    ratios = [math.exp(d) for d in flat]
    return Agreement(
        tokens=len(flat),
        delta_mean=sum(flat) / len(flat),
        abs_delta_mean=sum(abs(d) for d in flat) / len(flat),
        abs_delta_max=max(abs(d) for d in flat),
        ratio_mean=statistics.median(step_means),
        ratio_mean_worst=max(step_means, key=lambda r: abs(r - 1.0)),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
    )


def score(
    model_dir: Path, calls: dict[float, list[Call]], trainer_dtype: str, batch: int, threads: int
) -> dict[str, Agreement]:
    """``{"t1.0": ..., "t0.7": ..., "t0.7_noT": ...}`` for one trainer dtype."""
    import torch

    from trainer.backends.torch_backend import load_backend
    from trainer.config import AlgorithmConfig

    backend = load_backend(model_dir, AlgorithmConfig(), torch_threads=threads)
    if trainer_dtype == "bf16":
        backend.model.to(torch.bfloat16)
    out: dict[str, Agreement] = {}
    for temperature, sampled in calls.items():
        trained = [trainer_logprobs(backend, c) for c in sampled]
        out[f"t{temperature}"] = agreement(trained, sampled, batch)
        if temperature != 1.0:
            ignored = [trainer_logprobs(backend, c, ignore_temperature=True) for c in sampled]
            out[f"t{temperature}_noT"] = agreement(ignored, sampled, batch)
    return out


def against_server(
    model_dir: Path, vllm_dtype: str, args: argparse.Namespace, log_dir: Path
) -> tuple[dict[str, Agreement], dict[str, float]]:
    """Start vLLM in ``vllm_dtype``, sample at every temperature, stop it; then score in fp32 and bf16."""
    from infra.engine.vllm_server import VllmLaunch, VllmServer

    launch = VllmLaunch(
        model=model_dir,
        served_model_name=SERVED,
        port=free_port(),
        dtype="float32" if vllm_dtype == "fp32" else "bfloat16",
        max_model_len=args.max_model_len,
    )
    prompts = questions(args.n, args.seed)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    log_path = log_dir / f"logprob-agreement-vllm-{vllm_dtype}.log"
    log_path.unlink(missing_ok=True)  # the server appends: this run's log only
    server = VllmServer.start(launch, log_path=log_path)
    try:
        timings[f"vllm_{vllm_dtype}_start_s"] = round(time.perf_counter() - start, 1)
        timings[f"vllm_{vllm_dtype}_first_logprobs_s"] = round(warm_up(server.url), 1)
        calls = {
            t: asyncio.run(sample_calls(server.url, prompts, t, args.max_tokens, args.seed))
            for t in TEMPERATURES
        }
    finally:
        server.stop()
    results: dict[str, Agreement] = {}
    for trainer_dtype in ("fp32", "bf16"):
        for key, value in score(model_dir, calls, trainer_dtype, args.batch, args.threads).items():
            results[f"vllm_{vllm_dtype}_trainer_{trainer_dtype}_{key}"] = value
    return results, timings


def _resolve_model(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return Path(args.model).resolve()
    if args.smollm2:
        from trainer.models.smollm2 import build_smollm2

        return build_smollm2(None)
    return demo_model_dir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--n", type=int, default=32, help="calls per temperature")
    parser.add_argument("--batch", type=int, default=8, help="samples per trainer step")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="trainer's torch threads (0: all cores)")
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct instead of the demo's")
    parser.add_argument("--model", default=None, help="a Hugging Face model directory instead")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--vllm-bf16", action="store_true", help="also start vLLM in bfloat16")
    args = parser.parse_args()
    model_dir = _resolve_model(args)

    results: dict[str, Agreement] = {}
    timings: dict[str, float] = {}
    for vllm_dtype in ("fp32", "bf16") if args.vllm_bf16 else ("fp32",):
        found, spent = against_server(model_dir, vllm_dtype, args, LOGS)
        results.update(found)
        timings.update(spent)

    figures: dict[str, float] = {"calls_per_temperature": args.n, **timings}
    for key, value in results.items():
        figures[f"{key}_tokens"] = value.tokens
        figures.update(value.figures(key))
    goals = {
        f"vllm_fp32_trainer_fp32_t{t}_{what}": f"1 ± {RATIO_GOAL}"
        for t in TEMPERATURES
        for what in ("ratio_mean", "ratio_mean_worst")
    }
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return

    label = demo_model_label(model_dir) if (model_dir / "model.safetensors").is_file() else str(model_dir)
    print(
        f"trainer vs vLLM processed logprobs, {model_dir.name} ({label}), {args.n} calls per temperature, "
        f"≤ {args.max_tokens} tokens each, steps of {args.batch}; Δ = trainer − vLLM, ratio = exp(Δ)"
    )
    head = (
        f"{'vLLM':>4}  {'trainer':>9}  {'T':>3}  {'tokens':>6}  {'mean Δ':>9}  {'mean|Δ|':>9}  {'max|Δ|':>9}  "
        f"{'ratio mean':>10}  {'worst step':>10}  {'ratio min':>9}  {'ratio max':>9}"
    )
    print(head)
    for key, a in results.items():
        _, vllm_dtype, _, trainer_dtype, t = key.split("_", 4)
        ignored = t.endswith("_noT")
        temperature = t.removesuffix("_noT").removeprefix("t")
        who = f"{trainer_dtype} noT" if ignored else trainer_dtype
        print(
            f"{vllm_dtype:>4}  {who:>9}  {temperature:>3}  {a.tokens:>6}  {a.delta_mean:>9.2e}  "
            f"{a.abs_delta_mean:>9.2e}  "
            f"{a.abs_delta_max:>9.2e}  {a.ratio_mean:>10.6f}  {a.ratio_mean_worst:>10.6f}  "
            f"{a.ratio_min:>9.6f}  {a.ratio_max:>9.6f}"
        )
    print("timings: " + ", ".join(f"{k} {v}" for k, v in timings.items()))
    print("goals: " + ", ".join(f"{k} {v}" for k, v in goals.items()))


if __name__ == "__main__":
    main()
