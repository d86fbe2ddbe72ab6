"""verl 0.9's FSDP engine on the CPU: a platform plugin for verl and its worker run in this process.

verl resolves its device through a platform plugin API (``verl.plugin.platform``: ``PlatformBase``,
``PlatformRegistry``, ``set_platform``) and picks a training engine per device
(``EngineRegistry.get_engine_cls``); 0.9.1 ships CUDA, NPU and ROCm platforms, and registers its FSDP
engine for ``cuda`` and ``npu`` only. On a host without an accelerator it falls back to CUDA and fails.
:func:`install` adds the two missing pieces, without patching verl:

- :class:`CpuPlatform`: device ``cpu``, collectives over ``gloo``, a ``torch.cpu``-based device module
  whose memory probes report 0 (verl logs them; the CPU has no device allocator to ask).
- the FSDP engine (``FSDPEngineWithLMHead``) registered for ``device="cpu"``: the same class the GPU
  path runs, so forward, loss, backward, clipping and the optimiser step are verl's own.

What the CPU path needs from the engine's config (:data:`MODEL_OVERRIDES`, :data:`ENGINE_OVERRIDES`):
SDPA attention (verl defaults to ``flash_attention_2``, CUDA only; transformers' SDPA keeps verl's
packed, padding-free rows apart by their ``position_ids``), fp32 parameters and reductions (the torch
backend trains fp32 on the CPU, and with fp32 verl skips autocast), and no ``torch.compile``. Only
``strategy="fsdp2"`` runs: FSDP1 refuses CPU parameters with ``sync_module_states=True``, which verl
hard-codes (``verl/workers/engine/fsdp/transformer_impl.py``, ``_build_fsdp_module``).

:class:`LocalWorkerGroup` runs verl's ``TrainingWorker`` in this process (world size 1, a gloo process
group on a free local port) instead of in a Ray worker group, and answers the calls
:class:`~trainer.backends.verl_backend.VerlBackend` makes with the same ``.get()`` shape as Ray's.
Past one process, the same platform runs in every rank of verl's ``RayWorkerGroup``
(:mod:`trainer.backends.verl_ray`): FSDP shards the model over gloo.
"""

from __future__ import annotations

import os
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform, platform_manager, set_platform

from trainer.backends.base import BackendError

PLATFORM = "cpu"
#: merged into verl's ``HFModelConfig`` on the CPU
MODEL_OVERRIDES: dict[str, Any] = {"override_config": {"attn_implementation": "sdpa"}}
#: merged into verl's ``FSDPEngineConfig`` on the CPU
ENGINE_OVERRIDES: dict[str, Any] = {
    "mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    "use_torch_compile": False,
}


def _device_module() -> ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes on its device module (no-ops or zeros)."""
    module = ModuleType("flywheel_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    overrides: dict[str, Any] = {
        "current_device": lambda: PLATFORM,
        "device_count": lambda: 1,
        "empty_cache": nothing,
        "ipc_collect": nothing,
        "set_per_process_memory_fraction": nothing,
        "memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_allocated": zero,
        "max_memory_reserved": zero,
        "mem_get_info": lambda *args, **kwargs: (0, 0),
        "get_device_name": lambda *args, **kwargs: PLATFORM,
        "get_rng_state": torch.get_rng_state,
        "set_rng_state": torch.set_rng_state,
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
    }
    for name, value in overrides.items():
        setattr(module, name, value)
    return module


class CpuPlatform(PlatformBase):  # type: ignore[misc, unused-ignore]  # (verl is Any without it)
    """verl's platform interface on the CPU: gloo, no device memory, no profiler, no IPC."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM

    @property
    def vendor_name(self) -> str:
        return PLATFORM

    @property
    def device_module(self) -> ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    # verl declares an index, and passes it to .to() and torch.device(): 0 would mean cuda:0
    def current_device(self) -> str:  # type: ignore[override, unused-ignore]
        return PLATFORM

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # read by verl's Worker; nothing to hide on the CPU

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def install() -> None:
    """Make verl run on the CPU in this process: the platform, then the FSDP engine for ``cpu``.

    Idempotent. Must run before verl resolves its platform for anything else (its engine module reads
    the device name at import); a process where verl already chose another device is refused.
    """
    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(CpuPlatform)
    current = platform_manager._current_platform
    engine_module = sys.modules.get("verl.workers.engine.fsdp.transformer_impl")
    if current is None or current.device_name != PLATFORM:
        # replaceable: nothing resolved yet, or the CUDA fallback verl picks on a host without a GPU
        if (current is not None and current.is_available()) or (
            engine_module is not None and getattr(engine_module, "device_name", PLATFORM) != PLATFORM
        ):
            raise BackendError(
                f"verl already runs on {current.device_name if current else 'another device'!r} in this "
                "process: the CPU platform must be installed before verl's engine is first imported"
            )
        platform_cls = PlatformRegistry.get(PLATFORM)
        assert platform_cls is not None
        set_platform(platform_cls())
    with warnings.catch_warnings():
        # import-time noise of verl's own imports: a warning per optional engine it cannot import
        # (torchtitan, veomni, megatron, …) and Ray's deprecation of the `ray.experimental.state` that
        # verl.single_controller.ray imports
        warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"Ray state API", category=DeprecationWarning)
        # here, not at the top: verl's FSDP engine module reads the device when first imported
        from verl.workers.engine import EngineRegistry, FSDPEngineWithLMHead
    engines = EngineRegistry._engines.setdefault("language_model", {})
    if PLATFORM not in engines.get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend="fsdp2", device=PLATFORM)(
            FSDPEngineWithLMHead
        )
    assert get_platform().device_name == PLATFORM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_process_group(world_size: int | None = 1) -> bool:
    """The gloo process group for verl's FSDP; True when this call created it.

    Its rank and world size come from the environment: a rank of verl's ``RayWorkerGroup``
    (:mod:`trainer.backends.verl_ray`, ``world_size=None``) finds ``RANK``, ``WORLD_SIZE`` and
    ``MASTER_*`` set by verl; the in-process worker (:class:`LocalWorkerGroup`) sets them for one rank
    on a free local port, and refuses an environment that says otherwise."""
    # verl's Worker reads these from the environment (Ray sets them for its workers)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for name in ("RANK", "LOCAL_RANK"):
        os.environ.setdefault(name, "0")
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        os.environ.setdefault(name, "1")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world_size is not None and world != world_size:
        raise BackendError(
            f"WORLD_SIZE={world} in the environment: verl in this process runs {world_size} rank"
        )
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise BackendError(
                f"a process group of {dist.get_world_size()} ranks exists, verl expects {world}"
            )
        return False
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return True


class _Ready:
    """A result that is already there, with a Ray future's ``get()``."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def get(self) -> Any:
        return self._value


class LocalWorkerGroup:
    """verl's ``TrainingWorker`` in this process, called as VerlBackend calls a ``RayWorkerGroup``."""

    def __init__(self, worker_cls: Callable[..., Any], config: Any) -> None:
        install()
        self._owns_group = init_process_group()
        self._worker = worker_cls(config)

    def reset(self) -> None:
        self._worker.reset()

    def set_loss_fn(self, loss_fn: Callable[..., Any]) -> None:
        self._worker.set_loss_fn(loss_fn)

    def infer_batch(self, data: Any) -> _Ready:
        return _Ready(self._worker.infer_batch(data))

    def train_batch(self, data: Any) -> _Ready:
        return _Ready(self._worker.train_batch(data))

    def save_checkpoint(self, path: str, global_step: int) -> None:
        self._worker.save_checkpoint(path, global_step=global_step)

    def load_checkpoint(self, path: str, del_local_after_load: bool = False) -> None:
        self._worker.load_checkpoint(path, del_local_after_load=del_local_after_load)

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False
