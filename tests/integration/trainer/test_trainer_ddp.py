"""Data-parallel training (``--dp N``): the same batch over two ranks gives the one-rank update.

Real processes, a real gloo process group and the real tiny Qwen2 (``trainer.models.tiny``). Tolerance:
the ranks' gradients are summed in another order than one rank sums them, so the gradient norm and the
loss agree to ``rel=1e-5``, and the weights after five AdamW steps at lr 5e-3 to ``atol=5e-5`` — 1% of
one step (measured here: 1.3e-5; Adam divides by the root of the squared gradient, which magnifies the
last bits of near-zero gradients).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.unit.trainer.helpers import episode, transition
from trainer.app import load_backend, start_backend
from trainer.backends.base import Backend, BackendError
from trainer.backends.ddp import DataParallelProcessBackend, combine_metrics, shard_samples
from trainer.batching import Sample, TrainBatch, build_batch, sft_samples
from trainer.config import AlgorithmConfig
from trainer.groups import Group

ALGO = AlgorithmConfig(learning_rate=5e-3, sft_learning_rate=1e-2, tis_cap=2.0, kl_coef=0.05, ppo_epochs=2)
ATOL = 5e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"What is {a}+{b}? CALC: {a}+{b} = {a + b}" for a in range(10) for b in range(10)]
    return build_tiny(
        tmp_path_factory.mktemp("tiny"), corpus, vocab_size=300, hidden=64, layers=2, heads=4, kv_heads=2
    )


def _batch(step: int, version: int, groups: int = 3) -> TrainBatch:
    """``groups`` groups of four with different prompts and lengths: two rewarded answers, two not."""
    out = []
    for g in range(groups):
        gid = f"s{step}-g{g}"
        group = Group(gid, 4, 0.0)
        prompt = [1, 2, 3 + g, *range(40, 40 + 3 * g)]
        for i, (response, reward) in enumerate([([10, 11, 12 + g], 1.0), ([20 + g, 21], 0.0)] * 2):
            t = transition(prompt, response, reward=reward, version=version, logprob=-3.0 - 0.1 * i)
            e = episode(gid, i, reward, group_size=4, transitions=[t])
            group.members[e.episode_id] = e
        out.append(group)
    return build_batch(out, ALGO, version)


def _weights_equal(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for name, tensor in ours.items():
        worst = max(worst, float((theirs[name] - tensor).abs().max()))
    return worst


@pytest.mark.timeout(300)
def test_two_ranks_update_as_one_rank_and_checkpoint_from_rank0(model_dir: Path, tmp_path: Path) -> None:
    local = load_backend(model_dir, ALGO, torch_threads=1)
    dp = start_backend(model_dir, ALGO, torch_threads=1, dp=2)
    assert isinstance(dp, DataParallelProcessBackend) and isinstance(dp, Backend)
    try:
        assert dp.vocab_size == local.vocab_size and dp.version == 0
        for step in range(3):
            ours, theirs = local.train_step(_batch(step, step)), dp.train_step(_batch(step, step))
            assert theirs["dp_ranks"] == 2.0
            assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-5)
            assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-5, abs=1e-7)
            assert theirs["response_tokens"] == ours["response_tokens"]
            assert theirs["kl"] == pytest.approx(ours["kl"], rel=1e-4, abs=1e-9)
        # one sample: rank 1 gets no rows and still joins the reduction
        one = sft_samples([([1, 2, 3], [4, 5, 6])])
        assert dp.sft_step(one)["sft_loss"] == pytest.approx(local.sft_step(one)["sft_loss"], rel=1e-5)
        assert dp.version == local.version == 4
        weights = dict(dp.state_dict())
        assert _weights_equal(dict(local.model.state_dict()), weights) <= ATOL
        digests = dp.replica_digests()
        assert len(digests) == 2 and digests[0] == digests[1]

        path = dp.export_weights(tmp_path / "export")
        exported = load_file(str(path))
        assert sorted(p.name for p in path.parent.iterdir()) == ["model.safetensors"]
        assert all(torch.equal(exported[k], weights[k]) for k in exported)

        dp.save_checkpoint(tmp_path / "ckpt")
        dp.train_step(_batch(9, dp.version))
        assert dp.replica_digests()[0] != digests[0]
        dp.load_checkpoint(tmp_path / "ckpt", 4)
        assert dp.version == 4
        assert dp.replica_digests() == digests  # every rank resumed from rank 0's checkpoint
        # and the optimiser state came back too: the next step matches the one-rank run's
        ours, theirs = local.train_step(_batch(5, 4)), dp.train_step(_batch(5, 4))
        assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-5)
        assert _weights_equal(dict(local.model.state_dict()), dict(dp.state_dict())) <= ATOL
    finally:
        dp.close()


@pytest.mark.timeout(120)
def test_a_rank_failure_is_a_backend_error_and_the_group_survives(model_dir: Path) -> None:
    dp = DataParallelProcessBackend(model_dir, ALGO, world=2, torch_threads=1)
    try:
        with pytest.raises(BackendError, match="empty batch"):
            dp.train_step(TrainBatch([], _batch(0, 0).stats, []))
        with pytest.raises(BackendError, match="cannot load checkpoint"):
            dp.load_checkpoint(Path("/nonexistent/ckpt"), 3)
        assert dp.train_step(_batch(0, 0))["dp_ranks"] == 2.0
    finally:
        dp.close()


def test_shards_keep_prompt_clusters_whole_and_balance_tokens() -> None:
    def s(prompt: list[int], n: int, tag: str) -> Sample:
        return Sample(prompt, [7] * n, [1] * n, [-1.0] * n, 1.0, 0.1, tag)

    samples = [s([1, 2], 4, f"a{i}") for i in range(4)] + [s([3, 4, 5, 6], 8, f"b{i}") for i in range(4)]
    samples += [s([9], 2, "c")]
    shards = shard_samples(samples, 2)
    assert sorted(x.episode_id for sh in shards for x in sh) == sorted(x.episode_id for x in samples)
    for shard in shards:
        assert len({tuple(x.prompt_ids) for x in shard if x.episode_id[0] in "ab"}) <= 1
    loads = [sum(len(x.prompt_ids) + len(x.response_ids) for x in sh) for sh in shards]
    assert max(loads) - min(loads) <= 26  # a cluster of 4 × (2 + 4) tokens is the unit that moves
    # fewer clusters than ranks: split into samples, so no rank idles
    assert [len(sh) for sh in shard_samples(samples[:4], 2)] == [2, 2]
    assert [len(sh) for sh in shard_samples(samples[:1], 3)] == [1, 0, 0]


def test_metrics_combine_as_sums_token_means_and_the_slowest_rank() -> None:
    parts = [
        {"loss": 1.0, "clip_fraction": 0.5, "response_tokens": 10.0, "train_seconds": 2.0, "grad_norm": 3.0}
        | {"train_tokens_per_s": 50.0},
        {"loss": 2.0, "clip_fraction": 0.0, "response_tokens": 30.0, "train_seconds": 1.0, "grad_norm": 3.0}
        | {"train_tokens_per_s": 100.0},
    ]
    out = combine_metrics(parts)
    assert out["loss"] == 3.0 and out["response_tokens"] == 40.0 and out["grad_norm"] == 3.0
    assert out["clip_fraction"] == pytest.approx(0.125)
    assert out["train_seconds"] == 2.0 and out["train_tokens_per_s"] == pytest.approx(100.0)


TORCHRUN_SCRIPT = """
import json, sys
from pathlib import Path
from tests.integration.trainer.test_trainer_ddp import ALGO, _batch
from trainer.backends.ddp import start_torchrun_rank
backend = start_torchrun_rank(Path(sys.argv[1]), ALGO, torch_threads=1)
if backend is not None:  # rank 0: what the trainer service would call
    metrics = backend.train_step(_batch(0, 0))
    print(json.dumps({"ranks": metrics["dp_ranks"], "grad_norm": metrics["grad_norm"],
                      "digests": backend.replica_digests()}))
    backend.close()
"""


@pytest.mark.timeout(240)
def test_torchrun_launch_gives_rank0_the_backend_and_the_rest_follow(model_dir: Path, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", str(script), str(model_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    local = load_backend(model_dir, ALGO, torch_threads=1)
    assert out["ranks"] == 2.0
    assert out["grad_norm"] == pytest.approx(local.train_step(_batch(0, 0))["grad_norm"], rel=1e-5)
    assert out["digests"][0] == out["digests"][1]
