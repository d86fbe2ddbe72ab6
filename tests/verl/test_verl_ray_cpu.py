"""``--backend verl --dp 2`` on the CPU: verl's ``RayWorkerGroup`` of two ``TrainingWorker`` actors, FSDP
sharding the tiny model over gloo (:mod:`trainer.backends.verl_ray`), takes the same steps as verl's
single rank in this process (:class:`trainer.backends.verl_cpu.LocalWorkerGroup`) on the same batches.

The path is the multi-GPU / multi-node one: Ray schedules the actors, verl hands out the ranks, its
dispatch splits each batch over the two data-parallel ranks and gathers the results, FSDP reduces the
gradients. Tolerances (fp32), per step: loss ``1e-5`` absolute, gradient norm ``1e-4`` relative; the
weights after the steps: the update (their change from the initial weights) ``1e-3`` relative in norm,
as in ``test_verl_cpu.py`` (Adam's first steps move a weight by about lr·sign(g), and the two ranks sum
the gradient in another order).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.verl.test_verl_cpu import ALGO, _batch
from trainer.app import start_backend
from trainer.backends.base import Backend
from trainer.batching import BatchStats, TrainBatch

pytestmark = [pytest.mark.verl, pytest.mark.timeout(900)]
LOSS_TOL = 1e-5
GRAD_NORM_RTOL = 1e-4
UPDATE_RTOL = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"what is {a} + {b}? the answer is {a + b}." for a in range(12) for b in range(12)]
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", corpus, vocab_size=300)


Run = tuple[list[dict[str, float]], dict[str, torch.Tensor]]


def _batches() -> list[TrainBatch]:
    """Twice the four rows of ``test_verl_cpu.py`` (two per rank), then three of them: verl's dispatch
    needs equal chunks, so the backend adds a masked-out row (``verl_convert.pad_rows``)."""
    odd = TrainBatch(samples=_batch().samples[:3], stats=BatchStats(), group_ids=[])
    return [_batch(), _batch(), odd]


def _steps(backend: Backend) -> Run:
    metrics = [backend.train_step(batch) for batch in _batches()]
    assert backend.version == len(_batches())
    return metrics, {k: v.float() for k, v in backend.state_dict().items()}


def _update(weights: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(weights[k] - initial[k]).flatten() for k in sorted(initial)])


def test_two_ray_ranks_take_the_steps_of_one_process(model_dir: Path) -> None:
    from safetensors.torch import load_file

    one = start_backend(model_dir, ALGO, device="cpu", kind="verl")
    try:
        ours, our_weights = _steps(one)
    finally:
        one.close()

    two = start_backend(model_dir, ALGO, device="cpu", kind="verl", dp=2)
    try:
        ranks = two.worker_group.execute_all_sync("process_info")  # type: ignore[attr-defined]
        theirs, their_weights = _steps(two)
    finally:
        two.close()

    # the Ray path ran: two ranks of one gloo group, each in its own process, neither this one
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert {r["world_size"] for r in ranks} == {2}
    pids = {r["pid"] for r in ranks}
    assert len(pids) == 2 and os.getpid() not in pids

    for step, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        assert abs(t["loss"] - o["loss"]) <= LOSS_TOL, (step, t["loss"], o["loss"])
        assert t["grad_norm"] == pytest.approx(o["grad_norm"], rel=GRAD_NORM_RTOL), step
        assert t["response_tokens"] == o["response_tokens"]
    assert ours[0]["loss"] != ours[1]["loss"]  # the first step changed the weights the second saw
    assert theirs[2]["response_tokens"] == 11.0  # the padding row is outside the loss
    initial = load_file(str(model_dir / "model.safetensors"))
    delta_theirs, delta_ours = _update(their_weights, initial), _update(our_weights, initial)
    assert float(delta_ours.norm()) > 0
    gap = float((delta_theirs - delta_ours).norm() / delta_ours.norm())
    assert gap <= UPDATE_RTOL, gap
