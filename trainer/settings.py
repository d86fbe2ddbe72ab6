"""The trainer's settings: ``FLYWHEEL_TRAINER_*`` environment variables, built in ``main()``.

The algorithm's knobs live in one nested object, ``FLYWHEEL_TRAINER_ALGO__<FIELD>`` (for example
``FLYWHEEL_TRAINER_ALGO__LEARNING_RATE=1e-4``); see :class:`trainer.config.AlgorithmConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from infra.settings import FlywheelSettings
from trainer.config import AlgorithmConfig, LoraOptions, ModelOptions


class TrainerSettings(FlywheelSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    trainer_dir: Path | None = None  # default: <data_dir>/trainer
    trainer_base_model: Path | None = None  # a Hugging Face model directory (config.json + weights)
    trainer_mode: Literal["sync", "async"] = "async"
    trainer_objective: Literal["rl", "sft"] = "rl"
    trainer_batch_groups: int = Field(default=8, ge=1)
    trainer_max_in_flight: int = Field(default=16, ge=1)
    trainer_batch_timeout_s: float | None = None
    trainer_group_timeout_s: float = Field(default=600.0, gt=0)
    trainer_partial_groups: Literal["train", "drop"] = "train"
    trainer_min_partial: int = Field(default=2, ge=2)
    trainer_sync_every: int = Field(default=1, ge=1)
    trainer_checkpoint_every: int = Field(default=10, ge=1)
    trainer_keep_checkpoints: int = Field(default=3, ge=1)
    # every N versions a release candidate (VersionProposed; gateway/releases.py); 0: none
    trainer_release_every: int = Field(default=0, ge=0)
    trainer_expected_gateways: int = Field(default=1, ge=0)
    trainer_drain_timeout_s: float = Field(default=30.0, gt=0)
    trainer_engine_url: str = ""  # an engine to load weights into over HTTP (empty: none)
    trainer_engine_kind: Literal["flywheel", "vllm"] = "flywheel"
    trainer_engine_token: SecretStr | None = None  # bearer token for the engine's /load_weights
    trainer_success_threshold: float = 1.0
    trainer_tracker: Literal["none", "tensorboard", "wandb"] = "none"
    trainer_device: str = "cpu"
    trainer_torch_threads: int = Field(default=0, ge=0)  # 0: torch's default
    # bfloat16: mixed precision, fp32 weights and Adam, bf16 autocast (trainer/backends/precision.py)
    trainer_dtype: Literal["float32", "bfloat16"] = "float32"
    # recompute each decoder layer in the backward pass: less activation memory, about 1/3 more compute
    trainer_gradient_checkpointing: bool = False
    # train in a child process (trainer.backends.process): the step never waits for this process's GIL
    trainer_backend_process: bool = True
    # data-parallel ranks (trainer.backends.ddp; with verl: a Ray worker group of N FSDP ranks): N > 1
    # trains each batch split over N processes
    trainer_dp: int = Field(default=1, ge=1)
    # torch (this host's CPU/GPUs) or verl (trainer.backends.verl_backend: FSDP on Ray's GPUs, or CPU ranks)
    trainer_backend: Literal["torch", "verl"] = "torch"
    trainer_metrics_port: int = Field(default=0, ge=0, le=65535)  # Prometheus /metrics (0: off)
    trainer_algo: AlgorithmConfig = AlgorithmConfig()
    # the LoRA adapters when FLYWHEEL_POLICIES names policies (trainer/lora.py), FLYWHEEL_TRAINER_LORA__<FIELD>:
    # rank 8, alpha 16, target_modules q_proj,v_proj, learning_rate 2e-4, dropout 0
    trainer_lora: LoraOptions = LoraOptions()

    @property
    def trainer_model_options(self) -> ModelOptions:
        """The torch backend's dtype and gradient checkpointing (full model and LoRA alike)."""
        return ModelOptions(
            dtype=self.trainer_dtype, gradient_checkpointing=self.trainer_gradient_checkpointing
        )

    @property
    def trainer_root(self) -> Path:
        return self.trainer_dir or self.data_dir / "trainer"
