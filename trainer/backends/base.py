"""What the trainer service needs from a backend, and how a second backend (verl) plugs in.

The service owns everything around the optimiser: intake, grouping, advantages, staleness, the
weight-update protocol, checkpoints' metadata, metrics. A backend owns the model and the optimiser and
answers five questions: train on this batch, what are your weights (in memory, or as a file a server can
load), save and restore yourself, and which weight version you hold; ``close`` releases it. ``version`` increments with every
step that changes the weights; the service publishes it in ``WeightUpdateRequested``.

Exceptions:
    BackendError           anything a backend could not do (the service logs it, keeps the old weights
                           serving, and does not mark the batch's groups as trained)

verl as the second backend: :mod:`trainer.backends.verl_backend` (``--backend verl``) drives verl's
``TrainingWorker`` directly, one ``train_batch`` per step on a converted batch
(:mod:`trainer.backends.verl_convert`). The design first considered, kept here for the record: verl 0.9 has no "train on this
external batch" API, so a ``VerlBackend`` would keep a Ray ``RayPPOTrainer`` alive and feed it through a
*replay agent loop*: a subclass of ``verl.experimental.agent_loop.AgentLoopBase`` registered with
``@register("flywheel_replay")`` whose ``async run(...)`` pops the next pre-collected :class:`Sample` and
returns ``AgentLoopOutput(prompt_ids, response_ids, response_mask, response_logprobs, reward_score, ...)``.
``train_step`` enqueues the batch's samples (advantages are recomputed by verl's GRPO from
``reward_score`` grouped by ``uid`` = group id, or passed through as token-level rewards) and runs one
``fit`` iteration; ``algorithm.rollout_correction.bypass_mode=True`` makes the recorded behaviour
logprobs the old logprobs (or keep the recompute with ``rollout_is: token``, ``rollout_is_threshold`` =
``tis_cap``). ``export_weights`` goes through verl's checkpoint engine (``CheckpointEngineManager``) and a
vLLM sink (``trainer.vllm_sink.VllmSink``) reloads them, so nothing else in the service changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainer.batching import Sample, TrainBatch


class BackendError(RuntimeError):
    pass


@runtime_checkable
class Backend(Protocol):
    @property
    def version(self) -> int:
        """The weight version the backend currently holds."""

    @property
    def vocab_size(self) -> int | None:
        """Token ids at or above this are malformed input (None: unknown)."""

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on ``batch``; increments ``version``; returns metrics."""

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One supervised (cross-entropy) update; increments ``version``; returns metrics."""

    def state_dict(self) -> Mapping[str, Any]:
        """Weights in memory (tensors), for an in-process inference engine."""

    def export_weights(self, directory: Path) -> Path:
        """Write the weights where a server can load them; returns the path to hand over."""

    def save_checkpoint(self, directory: Path) -> None:
        """Weights and optimiser state into ``directory`` (the service writes the metadata)."""

    def load_checkpoint(self, directory: Path, version: int) -> None:
        """Restore what :meth:`save_checkpoint` wrote and set ``version``."""

    def close(self) -> None:
        """Release what the backend holds (a training process, workers); called once, at the end."""
