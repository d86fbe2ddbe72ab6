"""The torch backend in its own process: the same updates as in-process, errors as BackendError, and a
child that never outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.processes import child_gone_after_parent_killed
from tests.unit.trainer.helpers import episode, transition
from trainer.app import load_backend, start_backend
from trainer.backends.base import Backend, BackendError
from trainer.backends.process import ProcessBackend
from trainer.batching import BatchStats, TrainBatch, build_batch, sft_samples
from trainer.config import AlgorithmConfig
from trainer.groups import Group

REPO = Path(__file__).resolve().parents[3]
ALGO = AlgorithmConfig(learning_rate=5e-3, sft_learning_rate=1e-2, tis_cap=None)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"What is {a}+{b}? CALC: {a}+{b} = {a + b}" for a in range(10) for b in range(10)]
    return build_tiny(
        tmp_path_factory.mktemp("tiny"), corpus, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1
    )


def _batch(step: int, version: int) -> TrainBatch:
    """A group of four: two rewarded answers, two not."""
    gid = f"g{step}"
    group = Group(gid, 4, 0.0)
    for i, (response, reward) in enumerate([([10, 11], 1.0), ([20, 21], 0.0)] * 2):
        t = transition([1, 2, 3], response, reward=reward, version=version)
        e = episode(gid, i, reward, group_size=4, transitions=[t])
        group.members[e.episode_id] = e
    return build_batch([group], ALGO, version)


@pytest.mark.timeout(120)
def test_child_trains_exactly_as_in_process_and_checkpoints(model_dir: Path, tmp_path: Path) -> None:
    local = load_backend(model_dir, ALGO)
    child = start_backend(model_dir, ALGO, torch_threads=1, process=True)
    assert isinstance(child, ProcessBackend) and isinstance(child, Backend)
    try:
        assert child.vocab_size == local.vocab_size and child.version == 0
        for step in range(3):
            ours, theirs = local.train_step(_batch(step, step)), child.train_step(_batch(step, step))
            assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-4)
        child.sft_step(sft_samples([([1, 2, 3], [4, 5, 6])]))
        local.sft_step(sft_samples([([1, 2, 3], [4, 5, 6])]))
        assert child.version == local.version == 4
        weights = child.state_dict()
        for name, tensor in local.model.state_dict().items():
            assert torch.allclose(weights[name], tensor, atol=1e-6), name
        path = child.export_weights(tmp_path / "export")
        assert path.is_file()
        child.save_checkpoint(tmp_path / "ckpt")
        child.train_step(_batch(9, child.version))
        child.load_checkpoint(tmp_path / "ckpt", 4)
        assert child.version == 4
        for name, tensor in child.state_dict().items():
            assert torch.equal(tensor, weights[name]), name
    finally:
        child.close()


@pytest.mark.timeout(120)
def test_failures_come_back_as_backend_errors(model_dir: Path, tmp_path: Path) -> None:
    child = ProcessBackend(model_dir, ALGO, torch_threads=1)
    try:
        with pytest.raises(BackendError, match="empty batch"):
            child.train_step(TrainBatch([], BatchStats(), []))
        with pytest.raises(BackendError, match="cannot load checkpoint"):
            child.load_checkpoint(tmp_path / "missing", 3)
        assert child.version == 0  # nothing changed
        child.train_step(_batch(0, 0))  # and it still trains
        assert child.version == 1
        os.kill(child.pid, signal.SIGKILL)
        with pytest.raises(BackendError, match="training process"):
            child.train_step(_batch(1, 1))
    finally:
        child.close()
    with pytest.raises(BackendError, match="did not start"):
        ProcessBackend(tmp_path / "no-model", ALGO)


PARENT = """
import sys
from pathlib import Path
from trainer.backends.process import ProcessBackend
from trainer.config import AlgorithmConfig
backend = ProcessBackend(Path(sys.argv[1]), AlgorithmConfig(), torch_threads=1)
print(backend.pid, flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
def test_child_exits_when_its_parent_is_killed(model_dir: Path) -> None:
    gone = child_gone_after_parent_killed([sys.executable, "-c", PARENT, str(model_dir)], REPO, within_s=20)
    assert gone, "the training process outlived its killed parent"


@pytest.mark.timeout(60)
def test_a_child_that_misses_its_start_deadline_is_stopped(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.backends import process

    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(process.subprocess, "Popen", popen)
    with pytest.raises(BackendError, match="did not answer start"):
        ProcessBackend(model_dir, ALGO, torch_threads=1, start_timeout_s=0.01)
    assert len(started) == 1 and started[0].returncode is not None  # stopped and reaped, not left running


@pytest.mark.timeout(180)
def test_ppo_trains_in_the_child_and_the_engine_loads_its_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from infra.engine.weight_loading import check_state_dict, read_state_dict
    from trainer.ppo import VALUE_HEAD_FILE

    ppo = ALGO.model_copy(update={"algorithm": "ppo"})
    local = load_backend(model_dir, ppo)
    child = start_backend(model_dir, ppo, torch_threads=1, process=True)
    try:
        for step in range(2):
            batch = build_batch([_group(step, step)], ppo, step)
            ours, theirs = local.train_step(batch), child.train_step(batch)
            assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-4)
            assert theirs["value_loss"] == pytest.approx(ours["value_loss"], rel=1e-4)
        child.save_checkpoint(tmp_path / "ckpt")
        assert (tmp_path / "ckpt" / VALUE_HEAD_FILE).is_file()
        # the engine reads every top-level *.safetensors of a weights directory: the critic is not one
        engine_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        for source in (tmp_path / "ckpt", child.export_weights(tmp_path / "export")):
            tensors = read_state_dict(source)
            assert not any("value" in name for name in tensors)
            check_state_dict(engine_model, tensors)
        child.load_checkpoint(tmp_path / "ckpt", 2)
        assert child.version == 2
    finally:
        child.close()


def _group(step: int, version: int) -> Group:
    gid = f"p{step}"
    group = Group(gid, 4, 0.0)
    for i, (response, reward) in enumerate([([10, 11], 1.0), ([20, 21], 0.0)] * 2):
        t = transition([1, 2, 3], response, reward=reward, version=version)
        e = episode(gid, i, reward, group_size=4, transitions=[t])
        group.members[e.episode_id] = e
    return group
