"""verl's ``RayWorkerGroup`` of ``TrainingWorker`` ranks: the path past one process, on GPUs or the CPU.

:func:`worker_group` builds the group the way verl's own trainer does (``RayResourcePool`` →
``RayClassWithInitArgs`` → ``RayWorkerGroup``): Ray schedules one actor per rank, verl hands each its
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, the ranks shard the model with FSDP,
and every call (``infer_batch``, ``train_batch``) is split over the data-parallel ranks by verl's
dispatch and gathered back. Nothing here schedules, splits or reduces: that is all verl and Ray.

- ``device="cuda"``: one GPU per rank (``ray.init()`` joins a running cluster or starts one).
- ``device="cpu"``: :class:`CpuTrainingWorker` ranks, FSDP over gloo. Each actor installs the CPU
  platform of :mod:`trainer.backends.verl_cpu` before verl's engine is imported in it, then builds the
  gloo process group from the variables verl set. Ray is started here when it is not already running:
  local, ``num_cpus`` = the ranks, no dashboard, this repository on the actors' ``PYTHONPATH`` (they
  unpickle :class:`CpuTrainingWorker` by module name). On a CPU this is a correctness check of the
  multi-rank path (the same steps as one rank, ``tests/verl/test_verl_ray_cpu.py``), not a speed-up.

verl's dispatch needs one equal chunk per rank: the caller pads a batch whose rows do not split evenly
(:func:`trainer.backends.verl_convert.pad_rows`). A local Ray whose raylet is too slow to register
(a busy host) is started again, up to :data:`STARTUP_ATTEMPTS` times; any other Ray error is raised.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import psutil
import ray

from trainer.backends import verl_cpu

with warnings.catch_warnings():
    # Ray's deprecation of the `ray.experimental.state` that verl.single_controller.ray imports
    warnings.filterwarnings("ignore", message=r"Ray state API", category=DeprecationWarning)
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.engine_workers import TrainingWorker

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_ATTEMPTS = 3  # local Ray starts, when its raylet is too slow to register (a busy host)


class CpuTrainingWorker(TrainingWorker):  # type: ignore[misc, unused-ignore]  # (verl is Any without it)
    """verl's ``TrainingWorker`` as a Ray actor on the CPU: the platform, then gloo, then verl's init."""

    def __init__(self, config: Any) -> None:
        verl_cpu.install()  # in the actor, before verl's engine module is first imported
        # gloo, from the RANK / WORLD_SIZE / MASTER_* that verl's RayWorkerGroup set for this actor
        verl_cpu.init_process_group(world_size=None)
        super().__init__(config)

    def process_info(self) -> dict[str, int]:
        """This rank as the process group sees it, and the process it runs in
        (``RayWorkerGroup.execute_all_sync("process_info")``: one per rank)."""
        import torch.distributed as dist

        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "pid": os.getpid()}


def _is_ray(process: psutil.Process) -> bool:
    try:
        return "ray" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _stop_new_children(before: set[int]) -> None:
    """Stop this process's Ray children that are not in ``before`` (what a failed Ray start left)."""
    started = [c for c in psutil.Process().children(recursive=True) if c.pid not in before and _is_ray(c)]
    for child in started:
        child.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for child in alive:
        child.kill()
    psutil.wait_procs(alive, timeout=10)


def _start_local_ray(ranks: int) -> bool:
    """A local Ray for ``ranks`` CPU actors, unless one is running; True when this call started it."""
    if ray.is_initialized():
        return False
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            ray.init(
                num_cpus=ranks,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
            )
            return True
        except Exception as exc:  # Ray raises a bare Exception for this
            # Ray gives its raylet 30 s to register with the GCS (hard-coded, ray/_private/node.py): on a
            # busy host that is not always enough, and another start usually is
            if "timed out during startup" not in str(exc) or attempt == STARTUP_ATTEMPTS:
                raise
            _stop_new_children(before)  # the failed start's GCS, raylet, ...: Ray leaves them running
            ray.shutdown()
    raise AssertionError("unreachable")


def worker_group(config: Any, ranks: int, device: str) -> tuple[Any, bool]:
    """``ranks`` verl ``TrainingWorker`` actors as one ``RayWorkerGroup``, and whether Ray was started
    here (the caller shuts it down then)."""
    if device == "cpu":
        started = _start_local_ray(ranks)
        # one CPU per rank (verl's default bundle asks for 10: max_colocate_count), no GPU asked
        pool = RayResourcePool(process_on_nodes=[ranks], use_gpu=False, max_colocate_count=1)
        cls = RayClassWithInitArgs(cls=ray.remote(CpuTrainingWorker), config=config)
        return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu"), started
    started = not ray.is_initialized()
    ray.init(ignore_reinit_error=True)
    return (
        RayWorkerGroup(
            resource_pool=RayResourcePool(process_on_nodes=[ranks]),
            ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(TrainingWorker), config=config),
        ),
        started,
    )
