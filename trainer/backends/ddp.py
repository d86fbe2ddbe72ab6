"""Data-parallel torch training: one batch split over N ranks, one update, the same weights everywhere.

How a step runs (``torch.distributed``; gloo on the CPU, NCCL on GPUs)::

    rank 0: shard the batch (samples that share a prompt stay together, shards balanced by tokens)
    rank 0 → every rank: ("train_step", shards)            broadcast_object_list
    every rank: forward + backward on its shard            TorchBackend, unchanged
    every rank: all_reduce(SUM) of the gradients           TorchBackend.reduce_grads, before clipping
    every rank: clip + AdamW step                          identical inputs → identical weights
    rank 0: gather the ranks' metrics and combine them

The per-token loss weights (:mod:`trainer.batching`) already carry the whole batch's normalisation, so
the *sum* of the ranks' gradients is exactly the one-rank gradient of the whole batch (up to float
summation order), and so is every later step: the update does not depend on N. This is what
``DistributedDataParallel`` does with its gradient buckets, written out because DDP *averages* (it would
need every loss scaled by N) and because a rank with no rows still has to join the reduction.

Only rank 0 exports weights and writes checkpoints (once, not once per rank); on resume every rank
reads rank 0's checkpoint (the trainer directory is shared: one host, or one volume mounted by every
pod), and :meth:`DataParallelBackend.replica_digests` checks that the replicas agree.

Two launches, one code path:

- ``--dp N`` / ``FLYWHEEL_TRAINER_DP=N`` (:class:`DataParallelProcessBackend`): the trainer starts
  rank 0 as its training child (as :mod:`trainer.backends.process`), and rank 0 starts ranks 1..N-1 on
  this host; every rank exits when its parent does.
- ``torchrun --nproc-per-node N -m trainer.app`` (``RANK``/``WORLD_SIZE`` set, many hosts too): rank 0
  runs the trainer service with a :class:`DataParallelBackend` in its own process; the other ranks run
  :func:`follow` and never see the bus.

Exceptions: :class:`~trainer.backends.base.BackendError` (a rank failed or the group broke).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from trainer.backends.base import BackendError
from trainer.backends.process import _CALLS, ProcessBackend, exit_with_parent, serve_backend
from trainer.backends.torch_backend import TorchBackend, load_backend
from trainer.batching import Sample, TrainBatch
from trainer.config import AlgorithmConfig, ModelOptions

# metrics that add up over ranks; the token-weighted ones are averaged by response tokens
_SUMMED = ("loss", "response_tokens", "microbatches", "sft_loss")
_TOKEN_MEANS = (
    "clip_fraction",
    "kl",
    "reference_kl",
    "tis_mean",
    "tis_capped_fraction",
    "ratio_mean",
    "behaviour_kl",
    "nll",
    "m2",
    "m2_masked_fraction",
)


def shard_samples(samples: Sequence[Sample], world: int) -> list[list[Sample]]:
    """Split ``samples`` over ``world`` ranks: prompt clusters whole, shards balanced by tokens.

    Samples with the same prompt stay on one rank so its shared-prompt microbatches still run the
    prompt once (:mod:`trainer.backends.prefix`); clusters go largest first to the least-loaded rank
    (LPT scheduling). With fewer clusters than ranks the clusters are split into single samples, so
    no rank idles while another has several rows. Order inside a shard follows the batch's order.
    """
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
    clusters = list(by_prompt.values())
    if len(clusters) < world:
        clusters = [[i] for i in range(len(samples))]

    def cost(idx: list[int]) -> int:
        return sum(len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in idx)

    loads = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for cluster in sorted(clusters, key=cost, reverse=True):
        r = min(range(world), key=lambda k: (loads[k], len(owned[k]), k))
        owned[r].extend(cluster)
        loads[r] += cost(cluster)
    return [[samples[i] for i in sorted(idx)] for idx in owned]


def combine_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank's: sums, token-weighted means, the slowest rank's time."""
    out = dict(parts[0])
    tokens = [p.get("response_tokens", 0.0) for p in parts]
    total_tokens = sum(tokens)
    for key in _SUMMED:
        if key in out:
            out[key] = sum(p.get(key, 0.0) for p in parts)
    for key in _TOKEN_MEANS:
        if key in out:
            out[key] = sum(p.get(key, 0.0) * t for p, t in zip(parts, tokens, strict=True)) / max(
                1.0, total_tokens
            )
    seconds = max(p.get("train_seconds", 0.0) for p in parts)
    rate = sum(p.get("train_tokens_per_s", 0.0) * p.get("train_seconds", 0.0) for p in parts)
    out["train_seconds"] = seconds
    out["train_tokens_per_s"] = rate / seconds if seconds > 0 else 0.0
    out["dp_ranks"] = float(len(parts))
    return out


class _Replica:
    """One rank's model: a :class:`TorchBackend` whose gradients are summed over the group."""

    def __init__(self, backend: TorchBackend) -> None:
        self.backend = backend
        self.params = [p for g in backend.optimizer.param_groups for p in g["params"] if p.requires_grad]
        backend.reduce_grads = self._all_reduce

    def _all_reduce(self) -> None:
        # one flat buffer, one collective: 5 M fp32 grads in one message beat one message per tensor
        grads = []
        for p in self.params:
            if p.grad is None:  # a rank with no rows (or a parameter its rows never reach)
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = _flatten_dense_tensors(grads)  # type: ignore[no-untyped-call]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        reduced_all = _unflatten_dense_tensors(flat, grads)  # type: ignore[no-untyped-call]
        for g, reduced in zip(grads, reduced_all, strict=True):
            g.copy_(reduced)

    def digest(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum().item() + p.double().abs().sum().item() for p in self.params))

    def run(self, method: str, args: tuple[Any, ...]) -> Any:
        """Run one broadcast command on this rank (every rank, rank 0 included)."""
        b = self.backend
        if method == "train_step":
            shards, stats, group_ids = args
            return b.train_step(TrainBatch(shards[dist.get_rank()], stats, group_ids))
        if method == "sft_step":
            (shards,) = args
            return b.sft_step(shards[dist.get_rank()])
        if method == "load_checkpoint":
            directory, version = args
            b.load_checkpoint(directory, version)
            return None
        if method == "digest":
            return self.digest()
        raise BackendError(f"unknown data-parallel command {method!r}")


def _collect(result: Any, error: str | None) -> list[tuple[Any, str | None]]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (result, error))
    return gathered


def _run_everywhere(replica: _Replica, method: str, args: tuple[Any, ...]) -> list[Any]:
    """Every rank runs ``method``; results in rank order. A rank's exception fails the whole call."""
    result: Any = None
    error: str | None = None
    try:
        result = replica.run(method, args)
    except Exception as exc:  # reported by rank 0 after every rank has answered: no rank hangs
        error = f"rank {dist.get_rank()}: {type(exc).__name__}: {exc}"
    gathered = _collect(result, error)
    errors = [e for _, e in gathered if e]
    if errors:
        raise BackendError("; ".join(errors))
    return [r for r, _ in gathered]


def follow(replica: _Replica) -> None:
    """Ranks 1..N-1: run what rank 0 broadcasts until it broadcasts ``None`` (or the group breaks)."""
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return
        method, args = box[0]
        with contextlib.suppress(BackendError):  # rank 0 reports it; this rank keeps following
            _run_everywhere(replica, method, args)


class DataParallelBackend:
    """The :class:`~trainer.backends.base.Backend` of rank 0 (in a process whose group is initialised)."""

    def __init__(self, backend: TorchBackend) -> None:
        if not dist.is_initialized() or dist.get_rank() != 0:
            raise BackendError("DataParallelBackend runs on rank 0 of an initialised process group")
        self.replica = _Replica(backend)
        self.world = dist.get_world_size()
        self._closed = False

    @property
    def local(self) -> TorchBackend:
        return self.replica.backend

    @property
    def version(self) -> int:
        return self.local.version

    @property
    def vocab_size(self) -> int | None:
        return self.local.vocab_size

    def _everywhere(self, method: str, *args: Any) -> list[Any]:
        dist.broadcast_object_list([(method, args)], src=0)
        return _run_everywhere(self.replica, method, args)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if not batch.samples:
            raise BackendError("empty batch")
        shards = shard_samples(batch.samples, self.world)
        parts = self._everywhere("train_step", shards, batch.stats, batch.group_ids)
        return combine_metrics(parts)

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        if not samples:
            raise BackendError("empty SFT batch")
        return combine_metrics(self._everywhere("sft_step", shard_samples(samples, self.world)))

    def state_dict(self) -> Mapping[str, Any]:
        return self.local.state_dict()  # every replica holds the same weights: rank 0's are the answer

    def export_weights(self, directory: Path) -> Path:
        return self.local.export_weights(directory)  # once, by rank 0

    def save_checkpoint(self, directory: Path) -> None:
        self.local.save_checkpoint(directory)  # once, by rank 0

    def load_checkpoint(self, directory: Path, version: int) -> None:
        self._everywhere("load_checkpoint", directory, version)  # every rank reads rank 0's files

    def replica_digests(self) -> list[float]:
        """A checksum of every rank's parameters, in rank order (equal when the replicas agree)."""
        return [float(d) for d in self._everywhere("digest")]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            dist.broadcast_object_list([None], src=0)
        finally:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- launching
def _backend_name(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def _rank_device(device: str, local_rank: int) -> str:
    return f"cuda:{local_rank}" if device == "cuda" else device


def _build_replica(
    model_dir: Path, algo: AlgorithmConfig, device: str, threads: int, options: ModelOptions | None = None
) -> TorchBackend:
    return load_backend(model_dir, algo, device=device, torch_threads=threads, model_options=options)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, addr: str, port: int, device: str, timeout_s: float) -> None:
    if device.startswith("cuda"):
        torch.cuda.set_device(int(device.split(":")[1]) if ":" in device else rank)
    dist.init_process_group(
        _backend_name(device),
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def torchrun_world() -> tuple[int, int, int] | None:
    """``(rank, local_rank, world)`` when launched by ``torchrun`` with more than one rank, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world


def start_torchrun_rank(
    model_dir: Path,
    algo: AlgorithmConfig,
    *,
    device: str = "cpu",
    torch_threads: int = 0,
    model_options: ModelOptions | None = None,
) -> DataParallelBackend | None:
    """Under ``torchrun``: join the group; rank 0 gets its backend, every other rank follows and
    returns None when rank 0 closes the group."""
    found = torchrun_world()
    if found is None:
        raise BackendError("not launched by torchrun (RANK/WORLD_SIZE unset)")
    rank, local_rank, _ = found
    dev = _rank_device(device, local_rank)
    if dev.startswith("cuda"):
        torch.cuda.set_device(local_rank)
    dist.init_process_group(_backend_name(dev))  # env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
    local = _build_replica(model_dir, algo, dev, torch_threads, model_options)
    if rank == 0:
        return DataParallelBackend(local)
    try:
        follow(_Replica(local))
    finally:
        dist.destroy_process_group()
    return None


class DataParallelProcessBackend(ProcessBackend):
    """``--dp N``: rank 0 is the trainer's training child; it starts ranks 1..N-1 on this host."""

    def __init__(self, model_dir: Path, algo: AlgorithmConfig, *, world: int, **kwargs: Any) -> None:
        if world < 1:
            raise BackendError(f"data-parallel world size must be ≥ 1, not {world}")
        self.world = world
        super().__init__(model_dir, algo, **kwargs)

    def _child_argv(
        self, fd: int, model_dir: Path, algo: AlgorithmConfig, device: str, torch_threads: int
    ) -> list[str]:
        return [
            *(sys.executable, "-m", "trainer.backends.ddp", "--fd", str(fd), "--world", str(self.world)),
            *("--model-dir", str(model_dir), "--algo", algo.model_dump_json()),
            *("--device", device, "--threads", str(torch_threads)),
        ]

    def replica_digests(self) -> list[float]:
        digests: list[float] = self._call("replica_digests")
        return digests


def _serve_rank0(conn: Connection, args: argparse.Namespace) -> None:
    """Rank 0's child: start the other ranks, join the group, answer the trainer over the pipe."""
    port = _free_port()
    followers = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "trainer.backends.ddp", "--rank", str(r), "--world", str(args.world)),
                *("--port", str(port), "--model-dir", args.model_dir, "--algo", args.algo),
                *("--device", args.device, "--threads", str(args.threads)),
                *("--model-options", args.model_options),
            ],
            stdin=subprocess.DEVNULL,
        )
        for r in range(1, args.world)
    ]
    algo = AlgorithmConfig.model_validate(json.loads(args.algo))
    options = ModelOptions.model_validate_json(args.model_options)

    def build() -> DataParallelBackend:
        init_group(0, args.world, "127.0.0.1", port, _rank_device(args.device, 0), args.timeout_s)
        return DataParallelBackend(
            _build_replica(Path(args.model_dir), algo, _rank_device(args.device, 0), args.threads, options)
        )

    try:
        serve_backend(conn, build, calls=_CALLS | {"replica_digests"})
    finally:
        for p in followers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _follow_rank(args: argparse.Namespace) -> None:
    exit_with_parent(os.getppid())
    device = _rank_device(args.device, args.rank)
    init_group(args.rank, args.world, "127.0.0.1", args.port, device, args.timeout_s)
    algo = AlgorithmConfig.model_validate(json.loads(args.algo))
    options = ModelOptions.model_validate_json(args.model_options)
    replica = _Replica(_build_replica(Path(args.model_dir), algo, device, args.threads, options))
    try:
        follow(replica)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description="a rank of a data-parallel training group (internal)")
    parser.add_argument("--fd", type=int, help="rank 0: the pipe to the trainer")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--algo", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--model-options", default="{}")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    if args.rank == 0:
        if args.fd is None:
            parser.error("rank 0 needs --fd")
        exit_with_parent(os.getppid())
        _serve_rank0(Connection(args.fd), args)
    else:
        _follow_rank(args)


if __name__ == "__main__":
    main()
