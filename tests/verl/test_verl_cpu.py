"""``--backend verl`` on the CPU: verl 0.9.1's own FSDP engine (fsdp2, gloo, SDPA, fp32) trains the
demo-sized tiny Qwen2 through :mod:`trainer.backends.verl_cpu`, and two steps equal the torch backend's
on the same batches from the same weights.

Tolerances (fp32): loss ``1e-5`` absolute and gradient norm (before clipping) ``1e-4`` relative, per
step (measured: ~6e-8 and ≤ 1e-6); the first step's weight update ``1e-3`` relative in norm (measured
~4e-5: Adam's first step moves each weight by about lr·sign(g), so a gradient component within rounding
of zero can move differently under the two summation orders). ``token_budget=16`` splits the batch into
several micro-batches on both sides (verl: its dynamic batch size over unpadded tokens; torch: padded
rows), so the summed ``token-sum`` loss and the accumulated gradient are checked across micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer.app import start_backend
from trainer.backends.base import Backend
from trainer.backends.torch_backend import load_backend
from trainer.batching import BatchStats, Sample, TrainBatch
from trainer.config import AlgorithmConfig

pytestmark = [pytest.mark.verl, pytest.mark.timeout(600)]
LOSS_TOL = 1e-5
GRAD_NORM_RTOL = 1e-4
UPDATE_RTOL = 1e-3
ALGO = AlgorithmConfig(
    behaviour_weight="truncated",
    clip_low=0.2,
    clip_high=0.28,
    tis_cap=2.0,
    learning_rate=1e-3,
    token_budget=16,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"what is {a} + {b}? the answer is {a + b}." for a in range(12) for b in range(12)]
    # the demo's model shape: hidden 256, 4 layers, 4 heads / 2 KV heads, tied embeddings
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", corpus, vocab_size=300)


def _batch() -> TrainBatch:
    """Different lengths, a merged trajectory (observation tokens masked), behaviour logprobs around
    the random model's (≈ -log 300 ≈ -5.7) so that TIS weights vary and some reach the cap."""
    samples = [
        Sample([1, 2, 3, 4, 5], [10, 11], [1, 1], [-5.5, -6.6], 1.0, 0.25, "a"),
        Sample([1, 2], [20, 21, 22, 23], [1, 1, 1, 1], [-5.2, -6.0, -4.9, -5.9], -1.0, 0.125, "b"),
        Sample(
            [6, 7, 8],
            [11, 12, 13, 30, 31, 32, 14, 15],
            [1, 1, 1, 0, 0, 0, 1, 1],
            [-6.9, -5.1, -5.6, 0.0, 0.0, 0.0, -6.1, -5.4],
            0.5,
            0.1,
            "c",
        ),
        Sample([9, 40, 41, 42], [43, 44, 45], [1, 1, 1], [-5.8, -5.7, -6.4], -0.5, 0.2, "d"),
    ]
    return TrainBatch(samples=samples, stats=BatchStats(), group_ids=[])


Run = tuple[list[dict[str, float]], dict[str, torch.Tensor]]


def _two_steps(backend: Backend) -> Run:
    """Metrics of two steps on the batch, and the weights after the first."""
    first = backend.train_step(_batch())
    weights = {k: v.float() for k, v in backend.state_dict().items()}
    second = backend.train_step(_batch())
    assert backend.version == 2
    return [first, second], weights


def _update(weights: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> torch.Tensor:
    """The step's change of every weight, flat (tied embeddings: ``lm_head`` is the embedding)."""
    return torch.cat([(weights[k] - initial[k]).flatten() for k in sorted(initial)])


@pytest.fixture(scope="module")
def verl_run(model_dir: Path) -> Iterator[Run]:
    backend = start_backend(model_dir, ALGO, device="cpu", kind="verl")
    try:
        yield _two_steps(backend)
    finally:
        backend.close()


def test_verl_fsdp_steps_on_cpu_equal_the_torch_backends(model_dir: Path, verl_run: Run) -> None:
    from safetensors.torch import load_file

    theirs, their_weights = verl_run
    ours_backend = load_backend(model_dir, ALGO)
    ours, our_weights = _two_steps(ours_backend)
    assert ours[0]["microbatches"] > 1  # the budget splits the batch (verl splits it on its side too)
    for step, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        assert abs(t["loss"] - o["loss"]) <= LOSS_TOL, (step, t["loss"], o["loss"])
        assert t["grad_norm"] == pytest.approx(o["grad_norm"], rel=GRAD_NORM_RTOL), step
        assert o["grad_norm"] > ALGO.max_grad_norm  # both clipped the same norm before stepping
    initial = load_file(str(model_dir / "model.safetensors"))
    assert set(initial) <= set(their_weights) and set(initial) <= set(our_weights)
    delta_theirs, delta_ours = _update(their_weights, initial), _update(our_weights, initial)
    gap = float((delta_theirs - delta_ours).norm() / delta_ours.norm())
    assert gap <= UPDATE_RTOL, gap


def test_verl_on_cpu_reports_the_losss_parts(verl_run: Run) -> None:
    metrics = verl_run[0][0]
    assert metrics["clip_fraction"] == 0.0  # one epoch: the ratio is 1, nothing clips
    assert metrics["response_tokens"] == 14.0  # the masked observation tokens are not counted
    assert metrics["actor_pg_loss"] == pytest.approx(metrics["loss"])
