"""The settings base every service's ``settings.py`` extends. Built in ``main()``, never at import."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.tickets import TicketKey

DEV_ADMIN_TOKEN = "dev-admin-token"  # accepted only when FLYWHEEL_ENV=development, on a loopback address
MIN_TOKEN_CHARS = 32  # an admin token's length in production, and on any address beyond loopback


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``; anything else (``0.0.0.0``, a LAN address) is reachable."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, token: str, setting: str = "FLYWHEEL_ADMIN_TOKEN") -> str | None:
    """Why a server must not listen on ``host`` with ``token`` guarding its admin routes (one line), or None.

    On a loopback address anything goes (development); beyond it the placeholder, an empty or a short
    token would hand every tenant's data and the admin routes to whoever reaches the port."""
    if is_loopback(host):
        return None
    if token in ("", DEV_ADMIN_TOKEN):
        what = "the placeholder" if token else "empty"
    elif len(token) < MIN_TOKEN_CHARS:
        what = f"{len(token)} characters long"
    else:
        return None
    return (
        f"refusing to listen on {host}: {setting} is {what}; set at least {MIN_TOKEN_CHARS} random "
        "characters (openssl rand -hex 32), or listen on 127.0.0.1"
    )


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/flywheel``, else ``~/.local/share/flywheel``: absolute, one per user.

    Not relative to the working directory, so the keys ``flywheel keys create`` writes in one directory
    are the keys ``flywheel up`` started in another serves. A relative ``XDG_DATA_HOME`` is ignored, as
    the XDG Base Directory specification asks. Containers set ``FLYWHEEL_DATA_DIR=/data``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "flywheel"


class FlywheelSettings(BaseSettings):
    """Shared settings, read from ``FLYWHEEL_*`` environment variables (and ``.env``)."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", env_file=".env", extra="ignore")

    env: Literal["development", "production"] = "development"
    bus: Literal["memory", "kafka"] = "memory"
    kafka_bootstrap: str = "127.0.0.1:9092"
    # consumers of the episodes and transitions topics: a fetch returns at 16 KiB or after this long
    # (see infra.bus.kafka.KafkaBus); what an idle consumer costs, and the longest a record waits
    kafka_fetch_max_wait_ms: int = Field(default=20, ge=1, le=10_000)
    # a publish that the bus has not acknowledged in this long fails (the gateway then spools the event)
    publish_timeout_s: float = Field(default=10.0, gt=0)
    topic_prefix: str = ""
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="where local state lives: chdb, the gateway's spool and keys, journals, checkpoints "
        "(unset: $XDG_DATA_HOME/flywheel, else ~/.local/share/flywheel, whatever the working directory)",
    )
    clickhouse_url: str = ""  # empty: embedded chdb under data_dir/chdb; else http://user:pw@host:8123/db
    admin_token: SecretStr = SecretStr(DEV_ADMIN_TOKEN)
    # Host names the admin routes and the web view answer for besides loopback and the bound host
    # (comma-separated; "*": any). Unset on a bind beyond loopback: any Host (infra/origin.py)
    allowed_hosts: str = ""
    ui_session_idle_s: float = Field(
        default=30 * 60.0, gt=0, description="a web view sign-in ends after this long without a request"
    )
    ui_session_max_s: float = Field(
        default=12 * 3600.0, gt=0, description="a web view sign-in ends this long after it began, in any case"
    )
    # Shared by the workers and gateways: workers sign episode URLs with it, gateways admit a signed
    # episode's calls without reading flywheel.episodes (infra/tickets.py). Empty: no tickets; gateways
    # learn episodes from the topic.
    episode_key: SecretStr = SecretStr("")
    model: str = "policy"
    # The policy map (infra/policies.py): "a,b" or a JSON object naming LoRA adapters and the calls that
    # train each (model name, tenant, system-prompt match). Empty: one policy, fully fine-tuned.
    policies: str = ""
    # Production feedback is accepted this long after its session ended (then re-scores the session);
    # later, the gateway answers 409. Shared by the gateway (refuses) and the reward service (retains).
    feedback_window_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    # Production sessions and episodes opened without a deadline end after this much silence (an agent
    # that crashed never finishes its episode): the reward service closes them, the gateway forgets them.
    idle_timeout_s: float = Field(default=300.0, gt=0)
    log_level: str = "INFO"
    log_json: bool | None = None  # None: JSON when stderr is not a TTY

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> FlywheelSettings:
        if self.env == "production" and self.admin_token.get_secret_value() in ("", DEV_ADMIN_TOKEN):
            raise ValueError("FLYWHEEL_ADMIN_TOKEN must be set to a real secret when FLYWHEEL_ENV=production")
        if self.env == "production" and len(self.admin_token.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"FLYWHEEL_ADMIN_TOKEN must be at least {MIN_TOKEN_CHARS} random characters when "
                "FLYWHEEL_ENV=production (openssl rand -hex 32)"
            )
        if 0 < len(self.episode_key.get_secret_value()) < 16:
            raise ValueError("FLYWHEEL_EPISODE_KEY must be at least 16 characters (or empty: no tickets)")
        return self

    def ticket_key(self) -> TicketKey | None:
        secret = self.episode_key.get_secret_value()
        return TicketKey(secret) if secret else None

    @property
    def chdb_path(self) -> Path:
        return self.data_dir / "chdb"
