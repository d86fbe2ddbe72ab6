"""Trainer benchmark on the demo's model and the demo's settings.

The model is the demo's own base model (``examples.demo.warmstart.build_base(WarmStartConfig())``, see
``tests/benchmarks/engine.py``); B (groups per update), G (episodes per group), K (groups in flight),
the algorithm settings (learning rate, staleness bound and policy) are the demo's
(``examples.demo.run.stack_settings(DemoConfig(...))``), and NEW_TOKENS is the calculator agent's
``MAX_TOKENS``. The prompt is the agent's first call. What the benchmark leaves out of the demo: the
agent's further calls (one call per episode here, sampled as one ``n = G`` request per group), the
gateway's recording, the bus to Kafka/ClickHouse and the reward service; each episode generates the
full NEW_TOKENS (``ignore_eos``) so every update carries the same work.

Figures:
- ``trainer_tok_s``: forward+backward tokens/s of the torch backend (one GRPO step, B × G rows).
- ``engine_tok_s_b1`` / ``_b8``: the embedded engine's generation rate (``tests/benchmarks/engine.py``).
- ``*_sync_s`` / ``*_async_s``: wall-clock for the same number of policy updates with real generation
  (the embedded engine samples every group, the trainer requests rollouts itself): sync mode holds
  generation while it trains; async mode keeps up to K groups in flight and generates while it trains.
  The baseline is the fastest sync configuration (engine in-process or a child, training in a thread or
  a child process, one or all torch threads), so async must beat sync's best; async likewise runs with
  the engine in-process (``inproc_async_s``: the engine's decode thread in the trainer's process, as
  ``flywheel up`` runs it, training in a child) or as a child behind HTTP (``proc_async*``: the demo's
  setup, where the gateway, agents and reward service share the trainer's process), one torch thread
  each, and the best async is the figure. ``*_local_s``: training
  in a thread of the trainer's process (``trainer_backend_process=false``), where each step waits for
  the GIL whenever the service's event loop holds it.
  Each configuration runs ``--repeats`` times, interleaved; the figures are medians.
  ``async_speedup_vs_best_sync``: the median over repeats of one repeat's best sync over its best async
  (paired within a repeat, so a slow stretch of the machine hits both sides of a ratio alike).
- ``gen_ms_*`` / ``train_ms_*``: one update's generation and training step alone, at one thread and at
  every thread. They bound the ratio: async at one thread each needs at least ``max(gen, train)`` per
  update, sync at least ``gen + train`` (``ideal_overlap_speedup``).
- ``update_ms_inflight``: pause → resume of one weight update through the real gateway (engine
  upstream over ASGI) with 8 calls in flight: WeightUpdateRequested → drain → load → WeightsActivated.
  ``inflight_calls_left_ms``: when the last of those calls ended, from the update's start: the drain is
  the time the in-flight calls still needed to finish generating (NEW_TOKENS each).

- ``--dp``: data-parallel training alone (:mod:`trainer.backends.ddp`): one update of the demo's
  B × G rows on 1 rank × 1 thread (``ProcessBackend``) and on 2 ranks × 1 thread each
  (``DataParallelProcessBackend``, gloo), interleaved per repeat; ``dp1_update_ms`` / ``dp2_update_ms``
  are medians, ``dp_update_ratio`` the median over repeats of that repeat's 1-rank / 2-rank time.
  The baseline for what the machine allows: ``dp_ceiling_ratio``, the same 1-rank time over two
  independent 1-thread processes running the two ranks' shards at once with no communication at all
  (the wall time of the pair): no data-parallel scheme on this machine can beat it, whatever its
  collectives cost. ``dp_efficiency`` = ``dp_update_ratio`` / ``dp_ceiling_ratio``.

    python tests/benchmarks/trainer.py [--json] [--updates N] [--repeats R] [--dp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.demo.run import DemoConfig, stack_settings
from examples.demo_agents.calc_agent.agent import MAX_TOKENS, first_messages
from tests.benchmarks.engine import QUESTION, demo_model_dir, demo_model_label, demo_prompt
from trainer.config import AlgorithmConfig

_DEMO = DemoConfig(out=Path("."))
_DEMO_STACK = stack_settings(_DEMO, Path("."), Path("."))  # builds nothing, creates no directory
G = _DEMO.group_size  # episodes per group
B = _DEMO_STACK.trainer.trainer_batch_groups  # groups per update
K = _DEMO_STACK.trainer.trainer_max_in_flight  # groups in flight (async)
NEW_TOKENS = MAX_TOKENS  # the agent's max_tokens per call
ALGO: AlgorithmConfig = _DEMO_STACK.trainer.trainer_algo
ENGINE_SEQS = _DEMO_STACK.engine_max_num_seqs  # sequences the engine decodes at once


def _model_dir() -> Path:
    return demo_model_dir()


def _load(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def _questions(n: int) -> list[str]:
    """The demo's first ``n`` RL tasks' questions (one per group, as the demo's groups)."""
    from examples.demo_agents.calc_agent import tasks as calc_tasks

    return [str(t["input"]["question"]) for t in calc_tasks.sample("rl", 0, n)]


def _prompts(model_dir: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [demo_prompt(tokenizer, q) for q in _questions(n)]


def _samples(prompts: list[list[int]], vocab: int, seed: int = 0) -> Any:
    """One update's B × G samples: G per prompt (a GRPO group), random NEW_TOKENS responses."""
    import random

    from trainer.batching import BatchStats, Sample, TrainBatch

    rng = random.Random(seed)
    rows = len(prompts) * G
    samples = [
        Sample(
            list(prompt),
            [rng.randrange(vocab) for _ in range(NEW_TOKENS)],
            [1] * NEW_TOKENS,
            [-2.0] * NEW_TOKENS,
            rng.choice([-1.0, 1.0]),
            1 / (rows * NEW_TOKENS),
            f"e{g}-{i}",
        )
        for g, prompt in enumerate(prompts)
        for i in range(G)
    ]
    return TrainBatch(samples, BatchStats(), [])


def measure_trainer_tokens(model_dir: Path, steps: int = 3) -> float:
    """Forward+backward tokens/s (prompt and response) of one GRPO step on B × G rows."""
    from trainer.backends.torch_backend import TorchBackend

    backend = TorchBackend(_load(model_dir), ALGO)
    batch = _samples(_prompts(model_dir, B), backend.vocab_size or 512)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)
    backend.train_step(batch)  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        backend.train_step(batch)
    return tokens * steps / (time.perf_counter() - start)


class GateGateway:
    """A gateway's control behaviour in front of the benchmark's generator: closed while updating."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.open = asyncio.Event()
        self.open.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.in_flight = 0

    async def start(self) -> None:
        from schemas import CONTROL

        await self.bus.subscribe(CONTROL, "bench-gateway", self._on, from_beginning=False)

    async def _on(self, msg: Any) -> None:
        from schemas import (
            CONTROL,
            InferenceDrained,
            InferenceResumed,
            WeightsActivated,
            WeightUpdateFailed,
            WeightUpdateRequested,
        )

        e = msg.event
        if isinstance(e, WeightUpdateRequested):
            self.open.clear()
            await self.idle.wait()
            await self.bus.publish(CONTROL, InferenceDrained(version=e.version, gateway_id="bench"))
        elif isinstance(e, WeightsActivated | WeightUpdateFailed):
            self.open.set()
            await self.bus.publish(CONTROL, InferenceResumed(version=e.version, gateway_id="bench"))

    async def enter(self) -> None:
        await self.open.wait()
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


async def _pipeline(
    model_dir: Path,
    mode: str,
    updates: int,
    threads: int,
    engine_url: str | None = None,
    engine_token: str | None = None,
    backend_process: bool = True,
) -> float:
    """Seconds for ``updates`` policy updates with generation by the embedded engine.

    ``engine_url``: generate through ``flywheel engine`` in its own process (``/v1/completions`` with
    token-id prompts) and load weights over HTTP from checkpoints, as the distributed runtime does.
    """
    import httpx
    import torch

    from infra.bus.memory import MemoryBus
    from infra.engine import InferenceEngine, SamplingParams
    from schemas import (
        TASKS,
        TRANSITIONS,
        AgentKind,
        AgentRef,
        EpisodeScored,
        RolloutRequested,
        Task,
        Transition,
    )
    from trainer.backends.base import Backend
    from trainer.backends.process import ProcessBackend
    from trainer.backends.torch_backend import TorchBackend
    from trainer.checkpoints import CheckpointStore
    from trainer.groups import Intake
    from trainer.loop import LoopConfig
    from trainer.rollouts import RolloutPlanner
    from trainer.service import TrainerService
    from trainer.weights import HttpSink, InProcessSink, WeightSink, WeightSync

    torch.set_num_threads(threads)
    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=256)
    params = SamplingParams(n=G, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    await engine.complete(demo_prompt(engine.tokenizer), SamplingParams(max_tokens=4))
    backend: Backend = (
        ProcessBackend(model_dir, ALGO, torch_threads=threads)
        if backend_process
        else TorchBackend(_load(model_dir), ALGO)
    )
    import tempfile

    from examples.demo_agents.calc_agent import tasks as calc_tasks

    http = httpx.AsyncClient(timeout=120)
    sink: WeightSink = (
        HttpSink(engine_url, client=http, token=engine_token)
        if engine_url
        else InProcessSink(engine.load_weights)
    )

    async def sample(prompt: list[int]) -> list[tuple[list[int], list[float], int]]:
        if engine_url is None:
            result = await engine.complete(prompt, params)
            return [(c.token_ids, c.logprobs, min(c.weight_versions)) for c in result.choices]
        body = {
            "model": "policy",
            "prompt": list(prompt),
            "n": G,
            "max_tokens": NEW_TOKENS,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
            "return_weight_versions": True,
        }
        resp = (await http.post(f"{engine_url}/v1/completions", json=body)).json()
        return [
            (c["token_ids"], c["logprobs"]["token_logprobs"], min(c["weight_versions"]))
            for c in resp["choices"]
        ]

    async with MemoryBus() as bus:
        gate = GateGateway(bus)
        await gate.start()
        pending: dict[str, int] = {}
        tasks: set[asyncio.Task[None]] = set()

        async def generate(req: RolloutRequested) -> None:
            question = req.task.input["question"] if isinstance(req.task.input, dict) else QUESTION
            prompt = demo_prompt(engine.tokenizer, str(question))  # the task's own first call
            await gate.enter()
            try:
                choices = await sample(prompt)
            finally:
                gate.leave()
            for index, (ids, logprobs, version) in enumerate(choices):
                reward = sum(t % 2 for t in ids) / len(ids)
                t = Transition(
                    prompt_ids=list(prompt),
                    response_ids=ids,
                    response_mask=[1] * len(ids),
                    behaviour_logprobs=logprobs,
                    weight_version=version,
                    reward=reward,
                )
                await bus.publish(
                    TRANSITIONS,
                    EpisodeScored(
                        episode_id=f"{req.group_id}-{index}",
                        group_id=req.group_id,
                        group_size=G,
                        sample_index=index,
                        reward=reward,
                        transitions=[t],
                        num_calls=1,
                    ),
                )

        async def worker(msg: Any) -> None:
            req = msg.event
            pending[req.group_id] = pending.get(req.group_id, 0) + 1
            if pending[req.group_id] == req.group_size:  # one batched call per group (n = G)
                task = asyncio.create_task(generate(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        await bus.subscribe(TASKS, "bench-worker", worker)
        agent = AgentRef(kind=AgentKind.callable, spec="bench:agent")
        demo_tasks = (Task.model_validate(t) for t in calc_tasks.tasks("rl", 0))  # the demo's RL tasks
        planner = RolloutPlanner(bus, demo_tasks, agent, group_size=1)
        with tempfile.TemporaryDirectory() as tmp:
            service = TrainerService(
                bus=bus,
                backend=backend,
                weights=WeightSync(bus, [sink], expected_gateways=1),
                store=CheckpointStore(Path(tmp)),
                intake=Intake(),
                algo=ALGO,
                loop=LoopConfig(mode=mode, batch_groups=B, max_in_flight=K, checkpoint_every=10_000),  # type: ignore[arg-type]
                planner=planner,
            )
            await service.start()
            await service.run(max_steps=1)  # warm-up: first update, caches
            start = time.perf_counter()
            await service.run(max_steps=updates)
            elapsed = time.perf_counter() - start
            service.request_stop()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await service.stop(checkpoint=False)
    await http.aclose()
    await engine.close()
    backend.close()
    return elapsed


async def _pipeline_engine_process(
    model_dir: Path,
    mode: str,
    updates: int,
    threads: int,
    engine_threads: int,
    backend_process: bool = True,
    max_num_seqs: int | None = None,
) -> float:
    """``_pipeline`` with the engine as a ``flywheel engine`` child (the demo's setup), stopped after."""
    import tempfile

    from infra.engine.process import EngineProcess

    with tempfile.TemporaryDirectory() as tmp:
        proc = await EngineProcess.start(
            model_dir,
            log_path=Path(tmp) / "engine.log",
            model_name="policy",
            max_num_seqs=max_num_seqs or ENGINE_SEQS,
            threads=engine_threads,
        )
        try:
            return await _pipeline(
                model_dir,
                mode,
                updates,
                threads,
                engine_url=proc.url,
                engine_token=proc.admin_token,
                backend_process=backend_process,
            )
        finally:
            await proc.stop()


async def _update_latency(model_dir: Path, in_flight: int) -> dict[str, float]:
    """One weight update through the real gateway, with ``in_flight`` calls running on the engine."""
    import tempfile

    import httpx

    from gateway.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.upstream.client import make_upstream
    from infra.bus.memory import MemoryBus
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app
    from schemas import EPISODES, EpisodeStarted, UpstreamKind, new_episode_id
    from trainer.weights import InProcessSink, WeightSync, WeightUpdate

    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=256)
    new_weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        async with MemoryBus() as bus:
            upstream = make_upstream(
                "http://engine/v1",
                kind=UpstreamKind.embedded,
                transport=httpx.ASGITransport(app=create_engine_app(engine)),
            )
            settings = GatewaySettings(data_dir=Path(tmp), admin_token="bench-admin", gateway_id="gw-bench")
            app = create_app(settings, bus, [upstream], lifespan=False)
            gateway = app.state.gateway
            await gateway.start()
            sync = WeightSync(bus, [InProcessSink(engine.load_weights)], expected_gateways=1)
            from schemas import CONTROL

            async def observe(msg: Any) -> None:
                if type(msg.event).__name__ in ("InferenceDrained", "InferenceResumed"):
                    await sync.observe(msg.event)

            await bus.subscribe(CONTROL, "bench-trainer", observe, from_beginning=False)
            episode = new_episode_id()
            await bus.publish(EPISODES, EpisodeStarted(episode_id=episode))
            await gateway.episodes.training(episode)
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60
            )
            body = {
                "model": "policy",
                "messages": first_messages(QUESTION),
                "max_tokens": NEW_TOKENS,
                "extra_body": {},
            }
            url = f"/episodes/{episode}/v1/chat/completions"
            await client.post(url, json={**body, "max_tokens": 4})  # warm-up
            ended: list[float] = []

            async def call() -> httpx.Response:
                resp = await client.post(url, json=body)
                ended.append(time.perf_counter())
                return resp

            calls = [asyncio.create_task(call()) for _ in range(in_flight)]
            for _ in range(1000):
                if gateway.admission.in_flight >= in_flight or not in_flight:
                    break
                await asyncio.sleep(0.005)
            started = time.perf_counter()
            result = await sync.update(WeightUpdate(1, lambda: new_weights))
            responses = await asyncio.gather(*calls)
            # the drain is the in-flight calls' remaining generation: compare it with when they ended
            calls_left_ms = (max(ended) - started) * 1000 if ended else 0.0
            assert result.activated, result.error
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
            await client.aclose()
            await gateway.stop()
    await engine.close()
    return {
        "total_ms": result.total_ms,
        "drain_ms": result.drain_ms,
        "load_ms": result.load_ms,
        "calls_left_ms": calls_left_ms,
    }


def measure_phases(model_dir: Path, threads: int, reps: int = 5) -> dict[str, float]:
    """Median ms of one update's two phases alone, at ``threads`` torch threads.

    ``gen``: the update's B groups (B calls of n = G, concurrently) on the engine; ``train``: one step
    on their B × G transitions. Async mode at one thread each cannot beat ``max(gen_1t, train_1t)``;
    sync mode costs at least ``gen + train`` at its best thread count: these bound the ratio.
    """
    import statistics

    import torch

    from infra.engine import InferenceEngine, SamplingParams
    from trainer.backends.torch_backend import TorchBackend

    torch.set_num_threads(threads)

    async def gen_ms() -> tuple[float, list[list[int]]]:
        engine = InferenceEngine.from_pretrained(model_dir, max_model_len=256)
        prompts = [demo_prompt(engine.tokenizer, q) for q in _questions(B)]
        params = SamplingParams(n=G, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
        await engine.complete(prompts[0], SamplingParams(max_tokens=4))
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            times.append(time.perf_counter() - start)
        await engine.close()
        return statistics.median(times) * 1000, prompts

    gen, prompts = asyncio.run(gen_ms())
    backend = TorchBackend(_load(model_dir), ALGO)
    batch = _samples(prompts, backend.vocab_size or 512)
    backend.train_step(batch)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        backend.train_step(batch)
        times.append(time.perf_counter() - start)
    return {"gen_ms": gen, "train_ms": statistics.median(times) * 1000}


def measure_dp(model_dir: Path, repeats: int, steps: int = 5) -> dict[str, float]:
    """1 rank × 1 thread against 2 ranks × 1 thread on one update of the demo's batch (see ``--dp``)."""
    import statistics

    from trainer.backends.base import Backend
    from trainer.backends.ddp import DataParallelProcessBackend
    from trainer.backends.process import ProcessBackend

    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    batch = _samples(_prompts(model_dir, B), vocab)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)

    def step_ms(backend: Backend) -> float:
        try:
            backend.train_step(batch)  # warm-up
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                backend.train_step(batch)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1000
        finally:
            backend.close()

    def pair_ms() -> float:
        """Two independent 1-thread processes, one shard each, stepped at once: the machine's ceiling."""
        from concurrent.futures import ThreadPoolExecutor

        from trainer.backends.ddp import shard_samples
        from trainer.batching import TrainBatch

        halves = [TrainBatch(s, batch.stats, batch.group_ids) for s in shard_samples(batch.samples, 2)]
        pair = [ProcessBackend(model_dir, ALGO, torch_threads=1) for _ in halves]
        try:
            with ThreadPoolExecutor(2) as pool:  # each call waits on its child's pipe: both run at once
                list(pool.map(lambda bh: bh[0].train_step(bh[1]), zip(pair, halves, strict=True)))
                times = []
                for _ in range(steps):
                    start = time.perf_counter()
                    list(pool.map(lambda bh: bh[0].train_step(bh[1]), zip(pair, halves, strict=True)))
                    times.append(time.perf_counter() - start)
            return statistics.median(times) * 1000
        finally:
            for backend in pair:
                backend.close()

    one: list[float] = []
    two: list[float] = []
    ceiling: list[float] = []
    for _ in range(repeats):
        one.append(step_ms(ProcessBackend(model_dir, ALGO, torch_threads=1)))
        two.append(step_ms(DataParallelProcessBackend(model_dir, ALGO, world=2, torch_threads=1)))
        ceiling.append(pair_ms())
    ratios = [a / b for a, b in zip(one, two, strict=True)]
    ceilings = [a / c for a, c in zip(one, ceiling, strict=True)]
    return {
        "dp_pair_no_comm_ms": round(statistics.median(ceiling), 1),
        "dp_ceiling_ratio": round(statistics.median(ceilings), 2),
        "dp_efficiency": round(statistics.median(ratios) / statistics.median(ceilings), 2),
        "dp1_update_ms": round(statistics.median(one), 1),
        "dp2_update_ms": round(statistics.median(two), 1),
        "dp1_tok_s": round(tokens / statistics.median(one) * 1000, 1),
        "dp2_tok_s": round(tokens / statistics.median(two) * 1000, 1),
        "dp_update_ratio": round(statistics.median(ratios), 2),
        "dp_ratio_min_of_repeats": round(min(ratios), 2),
        "dp_ratio_max_of_repeats": round(max(ratios), 2),
    }


def _report_pretrained(
    model: Path, demo: Path, repeats: int, as_json: bool, figures: dict[str, float]
) -> None:
    """Full fine-tuning tokens/s (one GRPO step on the demo's B × G rows, AdamW, fp32) on ``model`` and on
    the demo's model, interleaved per repeat; medians."""
    import statistics

    big: list[float] = []
    small: list[float] = []
    for _ in range(repeats):
        big.append(measure_trainer_tokens(model, steps=1))
        small.append(measure_trainer_tokens(demo, steps=1))
    figures["pretrained_trainer_tok_s"] = round(statistics.median(big), 1)
    figures["demo_trainer_tok_s"] = round(statistics.median(small), 1)
    figures["pretrained_vs_demo"] = round(
        figures["pretrained_trainer_tok_s"] / figures["demo_trainer_tok_s"], 4
    )
    figures["rows_per_step"] = float(B * G)
    goals = {"pretrained_trainer_tok_s": "reported (no goal: the first pretrained model in the loop)"}
    if as_json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    for name, value in figures.items():
        print(f"{name:<32} {value:>12}  {goals.get(name, '')}")
    print(f"(models: {model} and the demo's; {B} groups × {G} rows of the demo prompt + {NEW_TOKENS} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--updates",
        type=int,
        default=24,
        help="timed updates per pipeline run (the steady state: async's first generation overlaps nothing)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration (medians reported)")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=None,
        help="pipeline configurations to run (default: all; the ratio needs a sync and an async one)",
    )
    parser.add_argument("--no-extras", action="store_true", help="skip the engine and update-latency figures")
    parser.add_argument("--dp", action="store_true", help="only the data-parallel figures (2 ranks vs 1)")
    parser.add_argument(
        "--pretrained",
        type=Path,
        default=None,
        help="only the trainer's tokens/s on this model (e.g. `flywheel model smollm2`), beside the demo model's",
    )
    args = parser.parse_args()
    import statistics

    from infra.logging import configure_logging

    configure_logging("WARNING", json=False)
    cores = os.cpu_count() or 1
    model_dir = _model_dir()
    import torch

    torch.set_num_threads(cores)
    figures: dict[str, float] = {"cores": float(cores)}
    if args.pretrained is not None:
        _report_pretrained(args.pretrained, model_dir, args.repeats, args.json, figures)
        return
    if args.dp:
        figures.update(measure_dp(model_dir, args.repeats))
        dp_goals = {"dp_update_ratio": "≥ 1.5"}
        if args.json:
            print(json.dumps({"figures": figures, "goals": dp_goals}))
            return
        print(f"{'figure':<32} {'value':>12}  goal")
        for name, value in figures.items():
            print(f"{name:<32} {value:>12}  {dp_goals.get(name, '')}")
        print(
            f"(model: the demo's, {demo_model_label(model_dir)}; one update of {B} groups × {G} episodes ×"
            f" {NEW_TOKENS} tokens; medians of {args.repeats} interleaved repeats)"
        )
        return
    figures["trainer_tok_s"] = round(measure_trainer_tokens(model_dir), 1)
    if not args.no_extras:
        from tests.benchmarks.engine import measure_engine

        figures.update(measure_engine((1, 8), model_dir=model_dir))
    # What bounds the ratio: each phase alone at one thread and at every thread.
    one, every = measure_phases(model_dir, 1), measure_phases(model_dir, cores)
    figures["gen_ms_1t"], figures["gen_ms_all"] = round(one["gen_ms"], 1), round(every["gen_ms"], 1)
    figures["train_ms_1t"], figures["train_ms_all"] = round(one["train_ms"], 1), round(every["train_ms"], 1)
    figures["ideal_overlap_speedup"] = round(
        (every["gen_ms"] + every["train_ms"]) / max(one["gen_ms"], one["train_ms"]), 2
    )
    # Sync gets every core for each phase (and, as a second candidate, one thread); async splits the
    # cores (one thread each) and overlaps. In-process: engine and trainer share the interpreter; proc:
    # the engine is a ``flywheel engine`` child with HTTP weight loads (the demo's setup). The runs of
    # one repeat are interleaved so a slow moment of the machine hits every configuration alike.
    runs: dict[str, list[float]] = {}
    u = args.updates
    configs: list[tuple[str, Any]] = [
        # engine in the trainer's process, training in a thread of it (no second process at all)
        ("inproc_sync_s", lambda: _pipeline(model_dir, "sync", u, cores, backend_process=False)),
        ("inproc_sync_1t_s", lambda: _pipeline(model_dir, "sync", u, 1, backend_process=False)),
        # engine in the trainer's process (`flywheel up`'s default), training in a child process
        ("inproc_sync_proc_s", lambda: _pipeline(model_dir, "sync", u, cores, backend_process=True)),
        ("inproc_async_s", lambda: _pipeline(model_dir, "async", u, 1, backend_process=True)),
        # the demo's setup: the engine is a `flywheel engine` child, training runs in a child process
        ("proc_sync_s", lambda: _pipeline_engine_process(model_dir, "sync", u, cores, cores)),
        ("proc_async_s", lambda: _pipeline_engine_process(model_dir, "async", u, 1, 1)),
        # training in a thread of the trainer's process instead: what the second process saves
        (
            "proc_sync_local_s",
            lambda: _pipeline_engine_process(model_dir, "sync", u, cores, cores, backend_process=False),
        ),
        (
            "proc_async_local_s",
            lambda: _pipeline_engine_process(model_dir, "async", u, 1, 1, backend_process=False),
        ),
        # every thread in both children: what pinning one each saves
        ("proc_async_all_s", lambda: _pipeline_engine_process(model_dir, "async", u, cores, cores)),
        # the engine decodes every in-flight episode at once (K × G), so no call queues inside it
        (
            "proc_async_kg_s",
            lambda: _pipeline_engine_process(model_dir, "async", u, 1, 1, max_num_seqs=K * G),
        ),
    ]
    if args.configs:
        configs = [c for c in configs if c[0] in args.configs]
    for _ in range(args.repeats):
        for name, run in configs:
            runs.setdefault(name, []).append(asyncio.run(run()))
    for name, values in runs.items():
        figures[name] = round(statistics.median(values), 3)
    sync_names = [n for n in runs if "_sync" in n]
    async_names = [n for n in runs if "_async" in n]
    best_sync = min(figures[n] for n in sync_names)
    best_async = min(figures[n] for n in async_names)
    figures["sync_ms_per_update"] = round(best_sync / args.updates * 1000, 1)
    figures["async_ms_per_update"] = round(best_async / args.updates * 1000, 1)
    # Paired: each repeat's best sync over the same repeat's best async, run minutes apart at most, so a
    # slow stretch of this shared machine (seen: the same configuration 5.9 s, then 7.4 s) hits both
    # sides of one ratio; the median of those ratios is the figure. The ratio of the two medians mixes
    # runs from different stretches; it is printed beside it.
    per_repeat = [
        min(runs[n][i] for n in sync_names) / min(runs[n][i] for n in async_names)
        for i in range(args.repeats)
    ]
    figures["async_speedup_vs_best_sync"] = round(statistics.median(per_repeat), 2)
    figures["speedup_min_of_repeats"] = round(min(per_repeat), 2)
    figures["speedup_max_of_repeats"] = round(max(per_repeat), 2)
    figures["speedup_of_medians"] = round(best_sync / best_async, 2)
    torch.set_num_threads(cores)
    if not args.no_extras:
        idle = asyncio.run(_update_latency(model_dir, 0))
        busy = asyncio.run(_update_latency(model_dir, 8))
        figures["update_ms_idle"] = round(idle["total_ms"], 1)
        figures["update_ms_inflight"] = round(busy["total_ms"], 1)
        figures["update_drain_ms_inflight"] = round(busy["drain_ms"], 1)
        figures["inflight_calls_left_ms"] = round(busy["calls_left_ms"], 1)
        figures["update_load_ms"] = round(busy["load_ms"], 1)
    goals = {
        "async_speedup_vs_best_sync": "≥ 1.5",
        "engine_tok_s_b1": "≥ 200",
        "engine_tok_s_b8": "≥ 1070",
    }
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    print(f"{'figure':<32} {'value':>12}  goal")
    for name, value in figures.items():
        print(f"{name:<32} {value:>12}  {goals.get(name, '')}")
    print(f"(model: the demo's, {demo_model_label(model_dir)})")
    print(
        f"(async vs sync: {args.updates} updates of {B} groups × {G} episodes × {NEW_TOKENS} tokens, K = {K}; "
        f"medians of {args.repeats} interleaved runs; speedup = median over repeats of that repeat's best"
        " sync / best async)"
    )


if __name__ == "__main__":
    main()
