"""The embedded stack's settings, composed per service (``StackSettings``): each part is its service's
own settings class, read from the same ``FLYWHEEL_*`` variables, so a variable sets one thing
(``tests/unit/test_stack_settings.py``; ``docs/configuration.md`` lists them all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.settings import GatewaySettings
from infra.eventlog.settings import EventLogSettings
from infra.otel.settings import OtelSettings
from infra.settings import FlywheelSettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings
from trainer.settings import TrainerSettings


class StackGatewaySettings(GatewaySettings):
    """The gateway's settings with the embedded stack's one different default."""

    gateway_port: int = 0  # 0: a free loopback port


# The parts of the stack's settings: each service's own class, read from the same FLYWHEEL_* variables
PARTS: dict[str, type[FlywheelSettings]] = {
    "gateway": StackGatewaySettings,
    "worker": WorkerSettings,
    "reward": RewardSettings,
    "trainer": TrainerSettings,
    "eventlog": EventLogSettings,
    "otel": OtelSettings,
}
# Fields two parts define, one variable for both (tests/unit/test_stack_settings.py lists why each is safe)
SHARED = frozenset({"metrics_port", "gateway_url"})


class _WithoutParts(PydanticBaseSettingsSource):
    """A settings source less the parts' names: the prefixed name of a part (``gateway``, ``trainer``,
    ...) is no variable; each part reads its own ``FLYWHEEL_*`` fields itself."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in self._source().items() if k not in PARTS}


class StackSettings(FlywheelSettings):
    """The embedded stack's settings, composed per service: the shared ``FLYWHEEL_*`` fields
    (:class:`~infra.settings.FlywheelSettings`), one object per part (``gateway``, ``worker``,
    ``reward``, ``trainer``, ``eventlog``, ``otel``: each service's own settings class, read from the
    same variables, so a variable sets one thing), and the stack's own knobs.

        StackSettings(data_dir=d, trainer_batch_groups=2)   # a field's name finds its part
        settings.trainer.trainer_batch_groups               # 2
        settings.replace(gateway_url=url)                   # a copy; the shared fields reach every part

    Every part carries the shared fields as the stack has them. ``metrics_port`` and ``gateway_url`` are
    the worker's and the reward service's both (:data:`SHARED`).
    """

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", env_file=".env", extra="ignore")

    gateway: StackGatewaySettings = Field(default_factory=StackGatewaySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    eventlog: EventLogSettings = Field(default_factory=EventLogSettings)
    otel: OtelSettings = Field(default_factory=OtelSettings)

    engine_max_num_seqs: int = Field(default=64, ge=1)
    engine_threads: int = Field(default=0, ge=0)  # torch threads for engine and trainer (0: torch's default)
    # True: the engine runs as a child process (``flywheel engine`` on a loopback port) with its own GIL;
    # False: in this process behind an ASGI transport (no process to start; what the tests use).
    engine_process: bool = False
    record_events: bool = True  # the recorder writes every event to the event log (chdb or server)
    run_worker: bool = True  # False: no worker of its own (``add_worker``, or ``flywheel worker`` elsewhere)
    # True: with no FLYWHEEL_EPISODE_KEY, the stack makes one up (signed episode URLs); False: it leaves
    # the key empty, episode URLs carry plain ids and the gateway learns episodes from flywheel.episodes
    make_episode_key: bool = True
    run_trainer: bool = True
    # gates.json (flywheel/gates.py): every release candidate is evaluated before it can serve
    release_gates: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            _WithoutParts(env_settings),
            _WithoutParts(dotenv_settings),
            file_secret_settings,
        )

    @model_validator(mode="before")
    @classmethod
    def _compose(cls, data: Any) -> Any:
        """Each part from the shared fields given, the fields given that are its own, and the
        environment (its class reads it); a part given as an object is kept (``_shared_everywhere``)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        shared = {k: v for k, v in data.items() if k in FlywheelSettings.model_fields}
        own = {k for k in cls.model_fields if k not in PARTS}
        for name, part in PARTS.items():
            if name in data:
                continue
            fields = {k: v for k, v in data.items() if k in part.model_fields and k not in own}
            data[name] = part(**{**fields, **shared})
        return {k: v for k, v in data.items() if k in cls.model_fields}

    @model_validator(mode="after")
    def _shared_everywhere(self) -> StackSettings:
        for name in PARTS:
            part = getattr(self, name)
            differ = {
                k: getattr(self, k)
                for k in FlywheelSettings.model_fields
                if getattr(part, k) != getattr(self, k)
            }
            if differ:
                object.__setattr__(self, name, part.model_copy(update=differ))
        return self

    def replace(self, **changes: Any) -> StackSettings:
        """A copy with ``changes`` (fields by name, as the constructor takes them): a shared field changes
        in the stack and in every part, a part's field in the part(s) that define it."""
        top = {k: v for k, v in changes.items() if k in type(self).model_fields}
        updated = self.model_copy(update=top)
        shared = {k: v for k, v in changes.items() if k in FlywheelSettings.model_fields}
        placed = set(top)
        for name in PARTS:
            part = getattr(updated, name)
            mine = {k: v for k, v in changes.items() if k in type(part).model_fields}
            placed |= set(mine)
            if mine or shared:
                object.__setattr__(updated, name, part.model_copy(update={**mine, **shared}))
        if unknown := set(changes) - placed:
            raise ValueError(f"no such setting: {', '.join(sorted(unknown))}")
        return updated
