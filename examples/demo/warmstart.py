"""The demo's model: a tiny Qwen2 built locally, warm-started by SFT on a sloppy teacher's demonstrations.

Both steps are cached outside the repository, under ``~/.cache/flywheel/demo/<key>/`` where the key
hashes everything that shapes the result (sizes, seed, teacher noise, SFT budget, this module's
``FORMAT``), so a second run with the same settings starts in seconds.

When copying emerges during SFT varies with the seed: after the same 1,000 steps seed 0 solved 22% of the
held-out problems and seed 2 only 1%, too few for RL to find a success in most groups. So the scheduled
SFT is followed by a competence gate (:class:`GateConfig`): the model runs the agent's protocol on problems
of the *SFT* split (never held-out ones) and must solve ``min_success`` of them.

* A model below ``reinit_below`` has not learned to copy at all: the scheduled SFT is run again from a
  re-initialised model (continuing SFT barely moved such a model: docs/results/tuning.md), up to
  ``max_attempts`` in all.
* A model between the two is *topped up*: ``top_up_steps`` more SFT steps at a lower rate, then checked
  again, up to ``max_top_ups`` times: a model that copies only some results gives RL only those to
  sharpen (docs/results/tuning.md).
* When every attempt fails and the best one is below ``reinit_below`` (so it was never topped up), that
  best model is topped up now (``top_up_best``): with most groups all-fail, an RL step waits long for
  signal (docs/results/tuning.md).

A model that passes at once is used as it is. Every stage is cached: re-initialised attempts under
``<key>/attempt-<k>/``, top-ups beside the model they continue (``topup-<key>/<n>/``), the gate's
decision under ``<key>/gate-<key>/gate.json``.

SFT runs through the trainer's own torch backend (``TorchBackend.sft_step``): one sample per
demonstration, the loss on the assistant's tokens only (``response_mask`` 0 on the system, user and
tool tokens), as the trainer's SFT mode would train on recorded episodes.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from examples.demo.agents import demo_agent
from examples.demo.warmconfig import (
    DEFAULT_CACHE,
    FORMAT,
    GateConfig,
    WarmStartConfig,
    render_chat,
)
from trainer.backends.torch_backend import TorchBackend
from trainer.batching import Sample
from trainer.config import AlgorithmConfig
from trainer.models.tiny import build_tiny

if TYPE_CHECKING:
    from examples.demo.agents import DemoAgent


def _agent(cfg: WarmStartConfig, agent: DemoAgent | None, cache: Path = DEFAULT_CACHE) -> DemoAgent:

    return agent if agent is not None else demo_agent(cfg.agent, cache)


def demonstrations(cfg: WarmStartConfig, agent: DemoAgent | None = None) -> list[list[dict[str, str]]]:
    """The teacher's SFT conversations for ``cfg.agent``."""
    return _agent(cfg, agent).demonstrations(cfg)


def conversation_sample(tokenizer: Any, messages: Sequence[dict[str, str]], index: int) -> Sample:
    """One demonstration as one sample: loss on the assistant turns (content + ``<|im_end|>``) only."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = render_chat(tokenizer, messages[:first], True)
    ids = list(prompt)
    mask: list[int] = []
    for i in range(first, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        before = render_chat(tokenizer, messages[:i], True)
        after = render_chat(tokenizer, messages[: i + 1], False)
        if before[: len(ids)] != ids or after[: len(before)] != before:
            raise ValueError("the chat template is not append-only for this conversation")
        observation = before[len(ids) :]
        response = after[len(before) : -1]  # content + <|im_end|>; the trailing newline is the template's
        ids += observation + response
        mask += [0] * len(observation) + [1] * len(response)
    response_ids = ids[len(prompt) :]
    return Sample(
        prompt_ids=prompt,
        response_ids=response_ids,
        response_mask=mask,
        behaviour_logprobs=[0.0] * len(response_ids),
        advantage=0.0,
        token_weight=1.0,
        episode_id=f"demo-{index}",
    )


def _normalised(batch: Sequence[Sample]) -> list[Sample]:
    tokens = sum(s.response_tokens for s in batch)
    return [
        Sample(
            s.prompt_ids,
            s.response_ids,
            s.response_mask,
            s.behaviour_logprobs,
            0.0,
            1.0 / tokens,
            s.episode_id,
        )
        for s in batch
    ]


Progress = Callable[[str], None]
# SFT's microbatches: length-sorted, at most this many padded tokens each. The gradient is the same as one
# microbatch padded to the batch's longest sample; less of the step is spent on padding
# (tests/benchmarks/warmstart.py).
SFT_TOKEN_BUDGET = 2048


def load_samples(
    cfg: WarmStartConfig, tokenizer: Any, path: Path, agent: DemoAgent | None = None
) -> list[Sample]:
    """The demonstrations as SFT samples, tokenised once and kept beside the model (rendering is slow)."""
    if path.is_file():
        rows = json.loads(path.read_text())
        return [Sample(p, r, m, [0.0] * len(r), 0.0, 1.0, f"demo-{i}") for i, (p, r, m) in enumerate(rows)]
    demos = demonstrations(cfg, agent)
    samples = [conversation_sample(tokenizer, d, i) for i, d in enumerate(demos)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([[s.prompt_ids, s.response_ids, s.response_mask] for s in samples]))
    return samples


def _lr(peak: float, step: int, steps: int | None) -> float:
    """Linear warm-up over 30 steps, then cosine decay to a tenth (constant when open-ended)."""
    warm = min(1.0, (step + 1) / 30)
    if steps is None:
        return peak * warm
    return peak * warm * (0.1 + 0.45 * (1.0 + math.cos(math.pi * step / steps)))


def build_base(
    cfg: WarmStartConfig, root: Path, init_seed: int | None = None, agent: DemoAgent | None = None
) -> Path:
    """The untrained model + tokenizer (tokenizer trained on the agent's corpus: the demonstrations'
    text)."""
    return build_tiny(
        root / "base",
        _agent(cfg, agent).corpus(cfg),
        vocab_size=cfg.vocab_size,
        hidden=cfg.hidden,
        layers=cfg.layers,
        seed=cfg.seed if init_seed is None else init_seed,
        max_positions=cfg.max_positions,
    )


def sft_train(
    model_dir: Path,
    samples: Sequence[Sample],
    *,
    steps: int | None,
    seconds: float | None,
    batch: int,
    lr: float,
    seed: int,
    progress: Progress | None = None,
) -> tuple[Any, int]:
    """Continue SFT from ``model_dir`` for ``steps`` steps or ``seconds`` of wall time.

    Returns the trained torch model and the number of steps taken.
    """
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    pad = getattr(model.config, "pad_token_id", None)
    backend = TorchBackend(
        model,
        AlgorithmConfig(sft_learning_rate=lr, token_budget=SFT_TOKEN_BUDGET),
        pad_id=int(pad) if pad is not None else 0,
    )
    rng = random.Random(f"sft-{seed}")
    t0 = time.perf_counter()
    step = 0
    pool = list(samples)
    while (steps is None or step < steps) and (seconds is None or time.perf_counter() - t0 < seconds):
        backend.cfg = backend.cfg.model_copy(update={"sft_learning_rate": _lr(lr, step, steps)})
        metrics = backend.sft_step(_normalised(rng.sample(pool, min(batch, len(pool)))))
        step += 1
        if progress is not None and (step % 25 == 0 or step == steps):
            progress(f"SFT step {step}: loss {metrics['sft_loss']:.3f} ({time.perf_counter() - t0:.0f}s)")
    model.train(False)
    return model, step


def warm_start(
    cfg: WarmStartConfig,
    cache: Path = DEFAULT_CACHE,
    progress: Progress | None = None,
    gate: GateConfig | None = None,
) -> tuple[Path, float]:
    """The SFT-warm-started model directory (built, or reused from the cache) and the seconds spent."""
    t0 = time.perf_counter()
    root = cache / cfg.key()
    agent = _agent(cfg, None, cache)
    model_dir = _scheduled_sft(cfg, root, cfg.seed, progress, agent)
    if gate is not None and gate.min_success > 0:
        model_dir = _gated(cfg, gate, model_dir, progress, agent)
    return model_dir, time.perf_counter() - t0


def _scheduled_sft(
    cfg: WarmStartConfig, root: Path, init_seed: int, progress: Progress | None, agent: DemoAgent
) -> Path:
    """Build the base model (initialised from ``init_seed``) under ``root`` and run the scheduled SFT."""
    out = root / "sft"
    done = out / "warmstart.json"
    if done.is_file():
        return out
    t0 = time.perf_counter()
    base = build_base(cfg, root, init_seed, agent)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    samples = load_samples(cfg, tokenizer, root / "samples.json", agent)
    model, steps = sft_train(
        base,
        samples,
        steps=cfg.sft_steps,
        seconds=None,
        batch=cfg.sft_batch,
        lr=cfg.sft_lr,
        seed=init_seed,
        progress=progress,
    )
    info = {
        "config": asdict(cfg),
        "init_seed": init_seed,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
    }
    return _save(model, tokenizer, out, done, info)


def _save(model: Any, tokenizer: Any, out: Path, done: Path, info: dict[str, Any]) -> Path:
    """Save a trained stage into ``out``; ``done`` (written last) marks the cache entry complete."""
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    done.write_text(json.dumps(info, indent=1))
    return out


def gate_record(cfg: WarmStartConfig, gate: GateConfig, cache: Path = DEFAULT_CACHE) -> dict[str, Any] | None:
    """What the gate decided for this warm start (``None`` before it ran or when it is disabled)."""
    path = _gate_dir(cache / cfg.key(), cfg, gate) / "gate.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _gate_dir(root: Path, cfg: WarmStartConfig, gate: GateConfig) -> Path:
    return root / f"gate-{gate.key(cfg)}"


def _top_up(
    cfg: WarmStartConfig, gate: GateConfig, model_dir: Path, root: Path, n: int, agent: DemoAgent
) -> Path:
    """``gate.top_up_steps`` more SFT steps from ``model_dir`` into ``root/sft`` (cached); ``root`` also
    gets a link to the demonstrations, as every model directory's parent has them."""
    out = root / "sft"
    done = out / "topup.json"
    if done.is_file():
        return out
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    samples = load_samples(cfg, tokenizer, model_dir.parent / "samples.json", agent)
    lr = cfg.sft_lr * gate.top_up_lr_scale
    model, steps = sft_train(
        model_dir,
        samples,
        steps=gate.top_up_steps,
        seconds=None,
        batch=cfg.sft_batch,
        lr=lr,
        seed=cfg.seed + 7 * n,
    )
    link = root / "samples.json"
    if not link.exists():
        root.mkdir(parents=True, exist_ok=True)
        link.symlink_to((model_dir.parent / "samples.json").resolve())
    info = {"from": str(model_dir), "steps": steps, "lr": lr, "seconds": time.perf_counter() - t0}
    return _save(model, tokenizer, out, done, info)


def _gated(
    cfg: WarmStartConfig, gate: GateConfig, sft_dir: Path, progress: Progress | None, agent: DemoAgent
) -> Path:
    """The first model that passes the gate: ``sft_dir``, a top-up of it, a re-initialised attempt or a
    top-up of one; the best one checked when none passes."""
    root = sft_dir.parent
    record = _gate_dir(root, cfg, gate) / "gate.json"
    if record.is_file():
        return Path(json.loads(record.read_text())["model_dir"])
    checks = agent.gate_tasks(cfg, gate.tasks)
    history: list[dict[str, Any]] = []

    def check(model_dir: Path, attempt: int, top_up: int) -> float:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        success = agent.gate_success(model, tokenizer, checks, cfg.seed)
        history.append(
            {"model_dir": str(model_dir), "success": success, "attempt": attempt, "top_up": top_up}
        )
        if progress is not None:
            step = f", top-up {top_up}" if top_up else ""
            progress(
                f"gate, attempt {attempt}{step}: {100 * success:.1f}% of {gate.tasks} SFT-split problems solved"
            )
        return success

    passed = False
    for attempt in range(gate.max_attempts):
        model_dir = sft_dir
        if attempt > 0:
            model_dir = _scheduled_sft(
                cfg, root / f"attempt-{attempt}", cfg.seed + 1000 * attempt, progress, agent
            )
        success = check(model_dir, attempt, 0)
        top_ups = model_dir.parent / f"topup-{gate.top_up_key(cfg)}"
        for n in range(1, gate.max_top_ups + 1):
            if success >= gate.min_success or success < gate.reinit_below:
                break
            model_dir = _top_up(cfg, gate, model_dir, top_ups / str(n), n, agent)
            success = check(model_dir, attempt, n)
        if success >= gate.min_success:
            passed = True
            break
    if not passed and gate.top_up_best:
        passed = _top_up_best(cfg, gate, history, check, agent)
    best = history[-1] if passed else max(history, key=lambda h: float(h["success"]))
    if not passed and progress is not None:
        progress(f"no model passed the gate; going on with the best ({100 * float(best['success']):.1f}%)")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
        json.dumps(
            {"gate": asdict(gate), "passed": passed, "history": history, "model_dir": best["model_dir"]},
            indent=1,
        )
    )
    return Path(str(best["model_dir"]))


def _top_up_best(
    cfg: WarmStartConfig,
    gate: GateConfig,
    history: list[dict[str, Any]],
    check: Callable[[Path, int, int], float],
    agent: DemoAgent,
) -> bool:
    """Every attempt failed. A best model below ``reinit_below`` was never topped up (it was re-initialised
    instead, and no attempt is left): top it up now, up to ``max_top_ups`` times. True once one passes."""
    best = max(history, key=lambda h: float(h["success"]))
    if float(best["success"]) >= gate.reinit_below:
        return False  # the loop already topped it up as far as it could
    model_dir, attempt, done = Path(str(best["model_dir"])), int(best["attempt"]), int(best["top_up"])
    top_ups = model_dir.parent / f"topup-{gate.top_up_key(cfg)}"
    for n in range(1, gate.max_top_ups - done + 1):
        model_dir = _top_up(cfg, gate, model_dir, top_ups / str(n), done + n, agent)
        if check(model_dir, attempt, done + n) >= gate.min_success:
            return True
    return False


def sft_only_baseline(
    cfg: WarmStartConfig,
    warm_dir: Path,
    out_dir: Path,
    seconds: float,
    progress: Progress | None = None,
    agent: DemoAgent | None = None,
) -> tuple[Path, int]:
    """The equal-time baseline: keep doing SFT on the teacher's data from the warm start for ``seconds``."""
    tokenizer = AutoTokenizer.from_pretrained(str(warm_dir))
    samples = load_samples(cfg, tokenizer, warm_dir.parent / "samples.json", agent)
    model, steps = sft_train(
        warm_dir,
        samples,
        steps=None,
        seconds=seconds,
        batch=cfg.sft_batch,
        lr=cfg.sft_lr * 0.3,  # continuing from a decayed schedule: a lower, constant rate
        seed=cfg.seed + 1,
        progress=progress,
    )
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir, steps


__all__ = ["DEFAULT_CACHE", "FORMAT", "GateConfig", "WarmStartConfig", "render_chat"]
