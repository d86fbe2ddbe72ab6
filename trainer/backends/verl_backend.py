"""``--backend verl``: the policy trained by verl 0.9's FSDP engine on Ray, one update per trainer step.

verl has no "train on this external batch" API, and ships no CPU platform (its FSDP and Megatron
engines register for CUDA/NPU only; :mod:`trainer.backends.verl_cpu` adds both for FSDP). The
least-coupled entry is its ``TrainingWorker`` (``verl/workers/engine_workers.py``) in a
``RayWorkerGroup``, used as verl's own
``tests/models/test_engine.py::test_actor_engine`` uses it: ``reset()`` builds the engine,
``set_loss_fn(partial(ppo_loss, config=ActorConfig(...)))`` the loss, and ``train_batch`` takes a
no-padding ``TensorDict`` (``left_right_2_no_padding(DataProto.to_tensordict())``) and runs forward,
backward and one optimiser step over its micro-batches.

One trainer step, as :meth:`VerlBackend.train_step` runs it:

1. :func:`trainer.backends.verl_convert.to_verl_batch`: Flywheel's samples → prompts, responses,
   masks (merged-trajectory observation tokens masked), behaviour logprobs, per-token advantages
   with Flywheel's per-episode weights folded in (``loss_agg_mode="token-sum"``: the same loss as
   :mod:`trainer.loss`, tested against verl's ``ppo_loss`` in ``tests/verl/``).
2. ``infer_batch``: π_old's logprobs (the weights before the step), and verl's
   ``compute_rollout_correction_weights(old - behaviour, rollout_is="token", threshold=tis_cap)``:
   Flywheel's truncated importance sampling (``AlgorithmConfig.tis_cap``).
3. ``train_batch`` once per ``ppo_epochs``.

Weights: :meth:`export_weights` saves verl's checkpoint with ``hf_model`` and hands the Hugging Face
directory (``<dir>/huggingface``) to the sinks (vLLM reloads it, :class:`trainer.weights.VllmSink`).
What is not supported here, and refused with a :class:`BackendError` instead of approximated:
``kl_coef > 0`` (a reference worker is not wired), SFT steps, and a batch whose samples were sampled at
different temperatures (:func:`~trainer.backends.verl_convert.batch_temperature`).

Temperature: verl's engine divides the logits by ``meta_info["temperature"]`` before the log-softmax;
it is the batch's sampling temperature (``Sample.temperature``), so π_old and π_θ are of the
distribution the behaviour logprobs are of. A batch that mixes temperatures is refused rather than split:
each ``train_batch`` is an optimiser step, so a split would take several steps per trainer step and
change the loss's normalisation. (verl's FSDP engine also reads a per-sample temperature tensor; that
path is not wired.)

Runs where the ``verl`` extra is installed (its own environment): on GPUs through Ray
(``FLYWHEEL_TRAINER_DEVICE=cuda``; the GPU acceptance run is ``tests/gpu/acceptance.sh``), and with
``device="cpu"`` (the default) as one rank in this process, through the platform plugin in
:mod:`trainer.backends.verl_cpu` (``tests/verl/test_verl_cpu.py``: two steps of the tiny model equal
the torch backend's). ``gpus=N > 1`` (``--dp N``) on the CPU: verl's ``RayWorkerGroup`` of N CPU
processes over gloo (:mod:`trainer.backends.verl_ray`; ``tests/verl/test_verl_ray_cpu.py``: their
steps equal the one rank's), the multi-GPU path run on the CPU as a correctness check.

Imported only when the verl backend is chosen (``trainer.app.start_backend``): without the extra, the
import itself is the :class:`BackendError` that says so.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from infra.logging import get_logger
from trainer.backends.base import BackendError
from trainer.backends.verl_convert import batch_temperature, pad_rows, to_verl_batch
from trainer.batching import Sample, TrainBatch
from trainer.config import AlgorithmConfig, ModelOptions

log = get_logger(__name__)

try:
    import ray
    from transformers import AutoConfig
    from verl import DataProto
    from verl.trainer.config import CheckpointConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from trainer.backends import verl_cpu, verl_ray

    with warnings.catch_warnings():
        # Ray's deprecation of the `ray.experimental.state` that verl.single_controller.ray imports
        warnings.filterwarnings("ignore", message=r"Ray state API", category=DeprecationWarning)
        from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
except ImportError as exc:
    raise BackendError(f"--backend verl needs the `verl` extra (uv sync --extra verl): {exc}") from exc

HF_SUBDIR = "huggingface"  # where verl's checkpoint manager writes the Hugging Face model


def _scalar(value: Any) -> float | None:
    """A verl metric (a number, a list of them, or a ``Metric``) as one float, None if not numeric.

    A ``Metric`` (``verl.utils.metric``) aggregates its micro-batches as it was told (``actor/pg_loss``:
    summed, ``actor/pg_clipfrac``: averaged); a list of them, one per data-parallel rank, is averaged
    over ranks (``Metric.aggregate_dp``, as verl's own trainer reduces them)."""
    inner = getattr(value, "value", value)
    if isinstance(inner, list | tuple) and inner and hasattr(type(inner[0]), "aggregate_dp"):
        return float(type(inner[0]).aggregate_dp(list(inner)))
    if hasattr(inner, "aggregate"):
        return float(inner.aggregate())
    if isinstance(inner, list | tuple):
        numbers = [v for v in (_scalar(x) for x in inner) if v is not None]
        return sum(numbers) / len(numbers) if numbers else None
    try:
        return float(inner)
    except (TypeError, ValueError):
        return None


class VerlBackend:
    """A :class:`~trainer.backends.base.Backend` whose model lives in verl's FSDP workers (Ray, or
    this process on the CPU)."""

    def __init__(
        self,
        model_dir: Path,
        algo: AlgorithmConfig,
        *,
        gpus: int = 1,
        strategy: str = "fsdp2",
        device: str = "cuda",
        model_options: ModelOptions | None = None,
    ) -> None:
        if algo.kl_coef > 0:
            raise BackendError("the verl backend does not wire a reference model yet: set kl_coef=0")
        if algo.lr_decay_steps is not None:
            raise BackendError("the verl backend keeps its learning rate constant: unset lr_decay_steps")
        if model_options is not None and model_options != ModelOptions():
            raise BackendError(
                "the verl backend does not wire trainer_dtype / trainer_gradient_checkpointing: use the torch backend"
            )
        if algo.behaviour_weight != "truncated" or algo.m2_threshold is not None:
            # verl's own rollout correction is the truncated weight: say so rather than train otherwise
            log.warning(
                "verl_backend_truncated_weights",
                behaviour_weight=algo.behaviour_weight,
                m2_threshold=algo.m2_threshold,
                applied=f"verl's truncated importance weights min(pi_old/mu, {algo.tis_cap})",
            )
        on_cpu = device == "cpu"
        if on_cpu and strategy != "fsdp2":
            raise BackendError("verl on the CPU runs fsdp2 (trainer.backends.verl_cpu)")
        if gpus < 1:
            raise BackendError(f"the verl backend needs at least one rank, got {gpus}")
        if on_cpu:  # before verl's engine module is first imported: it reads the device at import
            verl_cpu.install()
        self.cfg = algo
        self._version = 0
        hf = AutoConfig.from_pretrained(str(model_dir))
        self._vocab_size = int(hf.vocab_size)
        self.pad_id = int(getattr(hf, "pad_token_id", None) or 0)
        cpu_model: dict[str, Any] = verl_cpu.MODEL_OVERRIDES if on_cpu else {}
        cpu_engine: dict[str, Any] = verl_cpu.ENGINE_OVERRIDES if on_cpu else {}
        config = TrainingWorkerConfig(
            model_type="language_model",
            model_config=HFModelConfig(path=str(model_dir), use_remove_padding=True, **cpu_model),
            engine_config=FSDPEngineConfig(
                forward_only=False,
                strategy=strategy,
                fsdp_size=gpus,
                use_dynamic_bsz=True,
                use_remove_padding=True,
                max_token_len_per_gpu=algo.token_budget,
                infer_max_token_len_per_gpu=algo.token_budget,
                **cpu_engine,
            ),
            optimizer_config=FSDPOptimizerConfig(
                lr=algo.learning_rate,
                weight_decay=algo.weight_decay,
                betas=algo.betas,
                clip_grad=algo.max_grad_norm,
            ),
            checkpoint_config=CheckpointConfig(
                save_contents=["model", "optimizer", "extra", "hf_model"],
                load_contents=["model", "optimizer", "extra"],
            ),
        )
        self._local: verl_cpu.LocalWorkerGroup | None = None
        self._ray_started = False
        self._ranks = gpus
        self._wg: Any
        if on_cpu and gpus == 1:  # one rank, in this process (no Ray)
            self._local = self._wg = verl_cpu.LocalWorkerGroup(TrainingWorker, config)
        else:  # verl's RayWorkerGroup: one rank per GPU, or per CPU process over gloo
            self._wg, self._ray_started = verl_ray.worker_group(config, gpus, device)
        self._wg.reset()
        # Flywheel's loss (trainer.loss): PPO clip with clip-higher, no dual clip (clip_ratio_c → ∞),
        # advantages already weighted per token, summed (see trainer.backends.verl_convert)
        actor = ActorConfig(
            strategy=strategy,
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=-1,
            clip_ratio_low=algo.clip_low,
            clip_ratio_high=algo.clip_high,
            clip_ratio_c=1e9,
            loss_agg_mode="token-sum",
            use_kl_loss=False,
        )
        self._wg.set_loss_fn(partial(ppo_loss, config=actor))

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def worker_group(self) -> Any:
        """verl's ``RayWorkerGroup`` (or, one rank on the CPU, :class:`verl_cpu.LocalWorkerGroup`)."""
        return self._wg

    def _tensordict(self, samples: Sequence[Sample], temperature: float) -> tuple[Any, Any]:
        batch = to_verl_batch(samples, self.pad_id)
        proto = DataProto.from_single_dict(dict(batch.tensors), meta_info={"temperature": temperature})
        td = left_right_2_no_padding(proto.to_tensordict())
        tu.assign_non_tensor(td, global_batch_size=batch.rows)
        return proto, td

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if not batch.samples:
            raise BackendError("empty batch")
        temperature = batch_temperature(batch.samples)  # a mix is refused before Ray sees the batch
        t0 = time.perf_counter()
        rows = pad_rows(batch.samples, self._ranks)  # one equal chunk per data-parallel rank
        try:
            proto, td = self._tensordict(rows, temperature)
            out = self._wg.infer_batch(td).get()
            old = no_padding_2_padding(tu.get(out, "log_probs").cpu(), td)
            proto.batch["old_log_probs"] = old
            mask = proto.batch["response_mask"].float()
            if self.cfg.tis_cap is not None:
                weights, _ = compute_rollout_correction_weights(
                    old - proto.batch["rollout_log_probs"], mask, "token", self.cfg.tis_cap
                )
                proto.batch["rollout_is_weights"] = weights
            metrics: dict[str, float] = {}
            for _ in range(self.cfg.ppo_epochs):
                td = left_right_2_no_padding(DataProto.to_tensordict(proto))
                tu.assign_non_tensor(td, global_batch_size=len(rows))
                result = self._wg.train_batch(td).get()
                for key, value in (tu.get(result, "metrics") or {}).items():
                    number = _scalar(value)
                    if number is not None:
                        metrics[key.replace("/", "_")] = number
        except Exception as exc:  # Ray and verl raise their own types; the service needs one
            raise BackendError(f"verl train_step failed: {type(exc).__name__}: {exc}") from exc
        self._version += 1
        seconds = time.perf_counter() - t0
        tokens = float(sum(s.response_tokens for s in batch.samples))
        metrics.update(
            loss=metrics.get("actor_pg_loss", 0.0),
            clip_fraction=metrics.get("actor_pg_clipfrac", 0.0),
            response_tokens=tokens,
            train_seconds=seconds,
            train_tokens_per_s=sum(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)
            * self.cfg.ppo_epochs
            / seconds,
        )
        return metrics

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        raise BackendError("SFT steps are not wired for the verl backend: use the torch backend")

    def export_weights(self, directory: Path) -> Path:
        """verl's checkpoint with the Hugging Face model; returns ``<directory>/huggingface``."""
        try:
            self._wg.save_checkpoint(str(directory), global_step=self._version)
        except Exception as exc:
            raise BackendError(f"verl could not save to {directory}: {exc}") from exc
        hf = directory / HF_SUBDIR
        if not (hf / "config.json").is_file():
            raise BackendError(f"verl wrote no Hugging Face model under {hf}")
        return hf

    def state_dict(self) -> Mapping[str, Any]:
        """For an in-process engine: the exported Hugging Face weights, read back."""
        with tempfile.TemporaryDirectory() as tmp:
            hf = self.export_weights(Path(tmp))
            tensors: dict[str, Any] = {}
            for f in sorted(hf.glob("*.safetensors")):
                tensors.update(load_file(str(f)))
            return tensors

    def save_checkpoint(self, directory: Path) -> None:
        self.export_weights(directory)

    def load_checkpoint(self, directory: Path, version: int) -> None:
        try:
            self._wg.load_checkpoint(str(directory), del_local_after_load=False)
        except Exception as exc:
            raise BackendError(f"verl could not load {directory}: {exc}") from exc
        self._version = version

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            return
        if self._ray_started:
            ray.shutdown()
